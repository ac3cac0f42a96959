# Copyright (c) mmcalidet contributors. All rights reserved.
"""FusedClipOptimWrapper: the clipped update of mmengine's OptimWrapper
with the clipping inside torch's fused AdamW, and mmengine's own path
wherever that cannot hold."""
import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope
from torch import nn

from mmcalidet.engine import FusedClipOptimWrapper, total_grad_norm


@pytest.fixture(autouse=True)
def mmdet_scope():
    init_default_scope('mmdet')  # as the runner of an mmdet config


def train(wrapper_type: str, steps: int = 3, **optim):
    """A seeded MLP trained ``steps`` steps; its parameters, the logged
    gradient norms and the wrapper."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    cfg = dict(
        type=wrapper_type,
        optimizer=dict(type='AdamW', lr=1e-2, weight_decay=1e-2, fused=True),
        clip_grad=dict(max_norm=0.1, norm_type=2))
    cfg.update(optim)
    wrapper = build_optim_wrapper(model, cfg)
    gen = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen)
        wrapper.update_params(model(x).square().mean() * 50)
        if wrapper.clip_grad_kwargs and wrapper.grad_name == 'grad_norm':
            norms.append(MessageHub.get_current_instance().get_scalar(
                'train/grad_norm').current())
    return [p.detach().clone() for p in model.parameters()], norms, wrapper


@pytest.mark.parametrize('max_norm', [0.1, 1e6])  # clipping, none needed
def test_update_and_logged_norm_equal_mmengines(max_norm):
    clip = dict(max_norm=max_norm, norm_type=2)
    ours, our_norms, wrapper = train('FusedClipOptimWrapper', clip_grad=clip)
    theirs, their_norms, _ = train('OptimWrapper', clip_grad=dict(clip))
    assert isinstance(wrapper, FusedClipOptimWrapper)
    assert wrapper._foldable_grads() is None  # after zero_grad: no grads
    assert not hasattr(wrapper.optimizer, 'grad_scale')
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert our_norms == pytest.approx(their_norms, rel=1e-5)
    if max_norm < 1:
        assert min(their_norms) > max_norm  # the clipping did act


def test_the_fold_is_taken_where_it_can_hold(monkeypatch):
    calls = []
    monkeypatch.setattr(OptimWrapper, '_clip_grad',
                        lambda self: calls.append(self))
    train('FusedClipOptimWrapper', steps=1)
    assert not calls  # folded: mmengine's clipping never ran
    for optim in (dict(optimizer=dict(type='AdamW', lr=1e-2, fused=False)),
                  dict(optimizer=dict(type='SGD', lr=1e-2)),
                  dict(clip_grad=dict(max_norm=0.1, norm_type=1)),
                  dict(clip_grad=dict(type='value', clip_value=0.1)),
                  dict(clip_grad=dict(max_norm=0.1, error_if_nonfinite=True))):
        calls.clear()
        train('FusedClipOptimWrapper', steps=1, **optim)
        assert len(calls) == 1, optim


def test_without_clipping_it_is_a_plain_step():
    ours, _, _ = train('FusedClipOptimWrapper', clip_grad=None)
    theirs, _, _ = train('OptimWrapper', clip_grad=None)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_total_grad_norm_is_clip_grad_norms():
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(s, generator=gen) for s in ((3, 4), (7, ), (2, 2))]
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, max_norm=1e9)
    torch.testing.assert_close(total_grad_norm(grads), expected)


@pytest.mark.parametrize('max_norm', [0, -0.1, float('nan'), float('inf')])
def test_a_max_norm_that_is_not_a_finite_positive_number_is_refused(max_norm):
    with pytest.raises(ValueError, match='clip_grad.max_norm'):
        train(
            'FusedClipOptimWrapper',
            steps=1,
            clip_grad=dict(max_norm=max_norm, norm_type=2))
