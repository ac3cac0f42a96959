# Copyright (c) mmcalidet contributors. All rights reserved.
"""CalibratorOptimWrapperConstructor and SnapshotHook."""
from types import SimpleNamespace

import pytest
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from mmcalidet.engine import SnapshotHook
from testing import build_detector

CACHED = 'calidet/calidet_dino_tiny_coco-mini_cached.py'
OPTIM = dict(
    constructor='CalibratorOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2))


@pytest.fixture(autouse=True)
def mmdet_scope():
    init_default_scope('mmdet')  # as the runner of an mmdet config


def optimized(optim_wrapper):
    return {
        id(p)
        for group in optim_wrapper.optimizer.param_groups
        for p in group['params']
    }


@pytest.mark.parametrize('train_cls', [False, True])
def test_the_optimizer_holds_the_calibrator_only(train_cls):
    model = build_detector(CACHED, cache_train_cls_branches=train_cls)
    optim = build_optim_wrapper(model, OPTIM)
    head = model.bbox_head
    expected = {id(p) for p in head.califormer.parameters()}
    if train_cls:
        for branch in head.cls_branches[:-1]:  # not the encoder's
            expected |= {id(p) for p in branch.parameters()}
    assert optimized(optim) == expected
    assert len(optim.optimizer.param_groups) == 1  # no paramwise_cfg


def test_paramwise_keys_use_the_detectors_names():
    model = build_detector(CACHED)
    cfg = dict(
        OPTIM,
        paramwise_cfg=dict(
            custom_keys={'bbox_head.califormer.nodes': dict(lr_mult=0.5)}))
    optim = build_optim_wrapper(model, cfg)
    lrs = {
        id(p): g['lr']
        for g in optim.optimizer.param_groups for p in g['params']
    }
    assert lrs[id(model.bbox_head.califormer.nodes)] == pytest.approx(5e-5)
    others = [
        lr for k, lr in lrs.items()
        if k != id(model.bbox_head.califormer.nodes)
    ]
    assert others and all(lr == pytest.approx(1e-4) for lr in others)


def test_a_plain_detector_is_refused():
    model = build_detector('calidet/dino_tiny_coco-mini.py')
    with pytest.raises(TypeError, match='CaliDet detector'):
        build_optim_wrapper(model, OPTIM)


def test_snapshot_hook_saves_at_the_chosen_iterations():
    saved = []
    runner = SimpleNamespace(
        work_dir='w',
        save_checkpoint=lambda d, name, **kw: saved.append((name, kw)))
    hook = SnapshotHook(iters=[3, 1])
    for it in range(5):
        runner.iter = it
        hook.after_train_iter(runner, it)
    assert [n for n, _ in saved] == [
        'snapshot_iter_1.pth', 'snapshot_iter_3.pth'
    ]
    assert saved[0][1] == dict(
        save_optimizer=False, save_param_scheduler=False)
    with pytest.raises(ValueError):
        SnapshotHook(iters=[0])
