# Copyright (c) mmcalidet contributors. All rights reserved.
"""MergedGroupsOptimWrapperConstructor and merge_param_groups."""
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from torch import nn

from mmcalidet.engine import merge_param_groups

OPTIM = dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=1e-2),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}))


@pytest.fixture(autouse=True)
def mmdet_scope():
    init_default_scope('mmdet')  # as the runner of an mmdet config


class Toy(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
        self.head = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build(constructor: str):
    torch.manual_seed(0)
    model = Toy()
    return model, build_optim_wrapper(model,
                                      dict(OPTIM, constructor=constructor))


def test_one_group_per_setting_holding_every_parameter():
    model, optim = build('MergedGroupsOptimWrapperConstructor')
    groups = optim.optimizer.param_groups
    assert [g['lr'] for g in groups] == pytest.approx([1e-4, 1e-3])
    assert [len(g['params']) for g in groups] == [4, 4]
    assert [id(p) for g in groups for p in g['params']] == \
        [id(p) for p in model.parameters()]
    _, default = build('DefaultOptimWrapperConstructor')
    assert len(default.optimizer.param_groups) == 8


def test_the_same_updates_as_the_per_parameter_groups():
    models = []
    for constructor in ('MergedGroupsOptimWrapperConstructor',
                        'DefaultOptimWrapperConstructor'):
        model, optim = build(constructor)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            loss = model(torch.randn(5, 3, generator=gen)).square().mean()
            optim.update_params(loss)
        models.append(model)
    for merged, default in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(merged, default)


def test_merge_keeps_distinct_settings_apart():
    a, b, c = (nn.Parameter(torch.zeros(1)) for _ in range(3))
    merged = merge_param_groups([
        dict(params=[a], lr=1.0),
        dict(params=[b], lr=2.0),
        dict(params=[c], lr=1.0)
    ])
    assert [(g['lr'], g['params']) for g in merged] == [(1.0, [a, c]),
                                                        (2.0, [b])]


def test_a_group_without_params_is_refused():
    with pytest.raises(ValueError, match='without params'):
        merge_param_groups([dict(lr=1.0)])
