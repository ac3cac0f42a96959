# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tight tolerance of two routes' floats: last-bit differences pass,
any real change (a score or an AP moved by 1e-4, a label, a count, a key)
fails."""
import math

import numpy as np
import pytest
import torch
from mmengine.structures import InstanceData

from testing.tolerances import (TIGHT, assert_same_floats,
                                assert_same_predictions, assert_same_rows)


def last_bits(x: torch.Tensor, ulps: int = 4) -> torch.Tensor:
    """``x`` moved by a few float32 roundings (another CPU's kernels)."""
    out = x.clone()
    for _ in range(ulps):
        out = torch.nextafter(out, torch.full_like(out, math.inf))
    return out


def detections(seed: int = 0) -> InstanceData:
    gen = torch.Generator().manual_seed(seed)
    return InstanceData(
        scores=torch.rand(30, generator=gen),
        labels=torch.randint(0, 80, (30, ), generator=gen),
        bboxes=torch.rand(30, 4, generator=gen) * 600)


def copy_of(pred: InstanceData) -> InstanceData:
    return InstanceData(
        scores=pred.scores.clone(),
        labels=pred.labels.clone(),
        bboxes=pred.bboxes.clone())


def test_the_tolerance_is_stated_once():
    assert TIGHT == dict(rtol=1e-6, atol=1e-7)


def test_last_bits_pass_and_a_moved_score_fails():
    pred = detections()
    same = copy_of(pred)
    same.scores = last_bits(pred.scores)
    assert not torch.equal(same.scores, pred.scores)
    assert_same_predictions(same, pred)
    assert_same_floats(last_bits(pred.scores), pred.scores)
    moved = copy_of(same)
    moved.scores[7] += 1e-4
    with pytest.raises(AssertionError):
        assert_same_predictions(moved, pred)
    # labels and boxes stay exact
    other = copy_of(same)
    other.labels[3] = (other.labels[3] + 1) % 80
    with pytest.raises(AssertionError, match='labels'):
        assert_same_predictions(other, pred)
    shifted = copy_of(same)
    shifted.bboxes[0, 0] = last_bits(shifted.bboxes[0, 0], 1)
    with pytest.raises(AssertionError, match='boxes'):
        assert_same_predictions(shifted, pred)
    # one detection more is no longer the same
    more = InstanceData(
        scores=torch.cat([pred.scores, pred.scores[:1]]),
        labels=torch.cat([pred.labels, pred.labels[:1]]),
        bboxes=torch.cat([pred.bboxes, pred.bboxes[:1]]))
    with pytest.raises(AssertionError):
        assert_same_predictions(more, pred)


def test_rows_floats_within_the_tolerance_the_rest_exact():
    row = dict(
        method='CaliDINO',
        index=1,
        num_images=2,
        epsilon=0.125,
        E_t=dict(AP=0.4321, AP50=float('nan')),
        own=None,
        curve=[0.25, 0.5])
    twin = dict(row, E_t=dict(AP=0.4321 * (1 + 1e-8), AP50=float('nan')))
    assert_same_rows(twin, row)  # nan == nan, last bits
    changes = [
        dict(row, E_t=dict(AP=0.4321 + 1e-4, AP50=float('nan'))),
        dict(row, E_t=dict(AP=0.4321, AP50=0.0)),
        dict(row, num_images=3),
        dict(row, method='DINO'),
        dict(row, own=0.0),
        dict(row, curve=[0.25]),
        {
            k: v
            for k, v in row.items() if k != 'own'
        },
    ]
    for changed in changes:
        with pytest.raises(AssertionError):
            assert_same_rows(changed, row)
    assert_same_rows(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    with pytest.raises(AssertionError):
        assert_same_rows(np.array([1.0, 2.0]), np.array([1.0, 2.0001]))
