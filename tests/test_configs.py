# Copyright (c) mmcalidet contributors. All rights reserved.
"""Every shipped training config keeps the DETR recipe's gradient clipping
(mmdet's DINO and Deformable DETR: max_norm 0.1, L2): an override of
``optim_wrapper`` with ``_delete_`` or a new ``type`` would drop it, and
CaliDet's fine-tune starts with large CaliFormer gradients."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.optim import build_optim_wrapper

from mmcalidet.testing import PROJECT_ROOT, build_detector, get_config

CONFIGS = sorted(
    osp.relpath(path, osp.join(PROJECT_ROOT, 'configs'))
    for path in glob.glob(osp.join(PROJECT_ROOT, 'configs', '*', '*.py')))


def test_every_config_is_found():
    assert len(CONFIGS) >= 10
    assert 'calidet/calidet_dino_tiny_coco-mini.py' in CONFIGS
    assert 'context_shift/calidet_dino_tiny_context-shift.py' in CONFIGS


@pytest.mark.parametrize('name', CONFIGS)
def test_training_configs_clip_gradients(name):
    cfg = get_config(name)
    assert 'train_cfg' in cfg, f'{name} is not a training config'
    wrapper = cfg.optim_wrapper
    assert wrapper.get('type', 'OptimWrapper') == 'OptimWrapper', name
    assert wrapper.get('clip_grad') == dict(max_norm=0.1, norm_type=2), name


def test_the_built_optimizer_clips():
    name = 'calidet/calidet_dino_tiny_coco-mini.py'
    model = build_detector(name)
    wrapper = build_optim_wrapper(model, get_config(name).optim_wrapper)
    assert wrapper.clip_grad_kwargs == dict(max_norm=0.1, norm_type=2)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    wrapper.step()  # clips, then steps
    norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
    assert float(norm) == pytest.approx(0.1, rel=1e-3)
