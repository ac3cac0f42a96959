# Copyright (c) mmcalidet contributors. All rights reserved.
"""Training stops with one error naming the iteration and what is not
finite (head outputs before the Hungarian matching, loss terms), instead of
scipy's "matrix contains invalid numeric entries"."""
import copy
import re

import pytest
import torch
from mmdet.utils import register_all_modules
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper

from mmcalidet.models import NonFiniteError
from mmcalidet.models.non_finite import check_finite_losses, current_iteration
from testing import build_detector, demo_batch

register_all_modules()
CONFIGS = ('calidet/calidet_dino_tiny_coco-mini.py',
           'calidet/calidet_deformable-detr_tiny_coco-mini.py')
BATCH = demo_batch([[1, 2], [3]], size=64)
HEAD_ERROR = re.compile(
    r"non-finite head outputs at iteration 12 \(before the Hungarian "
    r"matching\): (.*); inputs: decoder hidden states (finite|not finite), "
    r"V' \(CaliFormer output\) (finite|not finite); "
    r"weights: (.*); images: (finite|not finite)$")
WEIGHTS = re.compile(r'(\d+) of \d+ tensors not finite \((.*)\)$')


def use_message_hub(monkeypatch, **info):
    hub = MessageHub('non-finite-test')
    for key, value in info.items():
        hub.update_info(key, value)
    monkeypatch.setattr(MessageHub, 'get_current_instance',
                        classmethod(lambda cls: hub))


@pytest.fixture
def at_iteration_12(monkeypatch):
    """mmengine's message hub as a runner has it before the 12th logged
    iteration (``runner.iter`` = 11)."""
    use_message_hub(monkeypatch, iter=11)


def train_step(model):
    """One training step; returns the error and whether any parameter
    changed."""
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(NonFiniteError) as info:
        model.train_step(copy.deepcopy(BATCH), optim)
    changed = any(not torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
                  for a, b in zip(before, model.parameters()))
    return str(info.value), changed


def layer_counts(parts):
    """``{name: (non-finite, total)}`` of the message's parts."""
    return {
        name: (int(bad), int(total))
        for name, bad, total in re.findall(
            r'(?:^|, )([^,(]+) \((\d+) of (\d+) values\)', parts)
    }


@pytest.mark.parametrize('config', CONFIGS)
def test_a_nan_classification_weight_stops_before_matching(
        config, at_iteration_12):
    model = build_detector(config)
    branches = model.bbox_head.cls_branches
    with torch.no_grad():  # class 0 of decoder layer 0
        branches[0].weight[0, 0] = float('nan')
    message, changed = train_step(model)
    match = HEAD_ERROR.match(message)
    assert match, message
    assert match.group(2) == match.group(3) == 'finite'
    counts = layer_counts(match.group(1))
    # Deformable DETR without box refinement shares one branch
    assert list(counts) == [
        f'decoder layer {i} logits' for i in range(model.decoder.num_layers)
        if branches[i] is branches[0]
    ]
    for bad, total in counts.values():
        assert bad * 80 == total  # the logit of class 0 of every query
    # the error names the weight, once though the branch is shared
    assert WEIGHTS.match(match.group(4)).groups() == (
        '1', 'bbox_head.cls_branches.0.weight'), match.group(4)
    assert match.group(5) == 'finite'
    assert not changed  # stopped before any update


@pytest.mark.parametrize('config', CONFIGS)
def test_a_nan_califormer_stops_and_says_v_prime(config, at_iteration_12):
    model = build_detector(config)
    with torch.no_grad():
        model.bbox_head.califormer.nodes[5, 0] = float('nan')
    message, changed = train_step(model)
    match = HEAD_ERROR.match(message)
    assert match, message
    # the hidden states are finite, V' is not: every decoder layer's
    # logits, not the boxes and not the (uncalibrated) encoder proposals
    assert (match.group(2), match.group(3)) == ('finite', 'not finite')
    assert list(layer_counts(match.group(1))) == [
        'decoder layer 0 logits', 'decoder layer 1 logits'
    ]
    assert WEIGHTS.match(match.group(4)).groups() == (
        '1', 'bbox_head.califormer.nodes'), match.group(4)
    assert not changed


def test_a_nan_image_is_named_with_finite_weights(at_iteration_12):
    model = build_detector(CONFIGS[0])
    model.train()
    batch = copy.deepcopy(BATCH)
    batch['inputs'] = [image.float() for image in batch['inputs']]
    batch['inputs'][1][0, 5, 7] = float('nan')
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(NonFiniteError) as info:
        model.train_step(batch, optim)
    match = HEAD_ERROR.match(str(info.value))
    assert match, str(info.value)
    assert match.group(2) == 'not finite'  # the hidden states
    assert match.groups()[3:] == ('all finite', 'not finite')


def test_a_nan_loss_term_is_named(at_iteration_12):
    model = build_detector(CONFIGS[0])
    # the logits stay finite, only LoMa's terms become NaN
    model.bbox_head.loss_loma.loss_weight = float('nan')
    message, changed = train_step(model)
    assert message == ('non-finite loss at iteration 12: d0.loss_loma=nan, '
                       'loss_loma=nan (the others are finite)')
    assert not changed


def test_check_finite_losses(monkeypatch):
    use_message_hub(monkeypatch)  # no runner: no iteration
    finite = dict(loss_cls=torch.tensor(1.0), loss_bbox=torch.tensor(2.0))
    check_finite_losses(torch.tensor(3.0), finite)  # nothing to say
    terms = dict(
        loss=torch.tensor(float('inf')),
        loss_cls=torch.tensor(float('inf')),
        loss_bbox=torch.tensor([1.0, float('nan')]),
        acc=torch.tensor(0.5))
    # outside a runner the iteration is not known
    assert current_iteration() is None
    with pytest.raises(NonFiniteError) as info:
        check_finite_losses(terms['loss'], terms)
    assert str(info.value) == ('non-finite loss: loss_cls=inf, '
                               'loss_bbox=nan (the others are finite)')
    big = torch.tensor(3e38)
    with pytest.raises(
            NonFiniteError,
            match=r'^non-finite loss: loss=inf, '
            r'every term is finite \(their sum overflows\)$'):
        check_finite_losses(big + big, dict(loss_a=big, loss_b=big))
    assert issubclass(NonFiniteError, FloatingPointError)
