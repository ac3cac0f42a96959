# Copyright (c) mmcalidet contributors. All rights reserved.
"""An optimizer over the calibrator's parameters only."""
from typing import Dict

from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.model import is_model_wrapper
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from torch import nn


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class CalibratorOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor over the modules a calibrator
    training updates (``model.calibrator_modules()``: the CaliFormer, and
    the decoder layers' classification branches with
    ``cache_train_cls_branches``) instead of the whole detector.

    The frozen trunk then costs nothing in the optimizer step (mmengine
    makes one parameter group per parameter when ``paramwise_cfg`` is set;
    a detector has hundreds). ``paramwise_cfg`` keys match the modules'
    names in the detector (``bbox_head.califormer...``).

    Args:
        optim_wrapper_cfg (dict): as ``DefaultOptimWrapperConstructor``.
        paramwise_cfg (dict, optional): as ``DefaultOptimWrapperConstructor``.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        if is_model_wrapper(model):
            model = model.module
        if not hasattr(model, 'calibrator_modules'):
            raise TypeError('CalibratorOptimWrapperConstructor needs a '
                            'CaliDet detector (calibrator_modules()), got '
                            f'{type(model).__name__}')
        return super().__call__(_Holder(model.calibrator_modules()))


class _Holder(nn.Module):
    """The calibrator's modules under their names in the detector."""

    def __init__(self, modules: Dict[str, nn.Module]) -> None:
        super().__init__()
        for name, module in modules.items():
            parent = self
            *path, leaf = name.split('.')
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(leaf, module)
