# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmengine's default optimizer constructor with its per-parameter groups
merged where their hyper-parameters agree."""
from typing import Dict, List

from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from torch import nn


def merge_param_groups(groups: List[Dict]) -> List[Dict]:
    """Merge parameter groups whose settings (every key but ``params``) are
    equal, in the order each setting first occurs, parameters in their
    order.

    Args:
        groups (list[dict]): torch ``param_groups``.

    Returns:
        list[dict]: one group per distinct setting.

    Raises:
        ValueError: if a group has no ``params``.
    """
    merged: List[Dict] = []
    for group in groups:
        if 'params' not in group:
            raise ValueError(f'a parameter group without params: {group}')
        settings = {k: v for k, v in group.items() if k != 'params'}
        for target in merged:
            if {k: v for k, v in target.items() if k != 'params'} == settings:
                target['params'].extend(group['params'])
                break
        else:
            merged.append(dict(group, params=list(group['params'])))
    return merged


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` whose optimizer holds one group
    per distinct setting instead of one per parameter.

    With a ``paramwise_cfg`` mmengine makes a group for every parameter
    (185 for the tiny DINO), and torch's AdamW, fused or not, runs its
    step group by group. Merging the groups whose settings agree leaves
    every parameter's update as it was (AdamW works element by element)
    and runs it in one call per setting. Checkpoints then hold the merged
    groups: resuming a run saved with the per-parameter groups needs the
    default constructor.

    Args:
        optim_wrapper_cfg (dict): as ``DefaultOptimWrapperConstructor``.
        paramwise_cfg (dict, optional): as ``DefaultOptimWrapperConstructor``.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optim_wrapper = super().__call__(model)
        optimizer = optim_wrapper.optimizer
        if optimizer.state:
            raise ValueError('the optimizer has state before its groups '
                             'are merged')
        optimizer.param_groups[:] = merge_param_groups(optimizer.param_groups)
        return optim_wrapper
