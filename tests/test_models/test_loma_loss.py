# Copyright (c) mmcalidet contributors. All rights reserved.
import numpy as np
import pytest
import torch

from mmcalidet.models import LoMaLoss, loma_class_weights
from mmcalidet.priors import flip_prior, sample_prior

K = 4


def formula(scores, prior, sample, gamma):
    """The paper's LoMa written out with loops (numpy, float64)."""
    b_num, q_num, k_num = scores.shape
    flat = np.full((k_num, k_num), 0.5)
    np.fill_diagonal(flat, 1.0)
    total = 0.0
    for b in range(b_num):
        for q in range(q_num):
            per_query = 0.0
            for j in range(k_num):
                w_j = sum(-np.sign(sample[b, i, j] - flat[i, j]) *
                          (prior[b, i, j] - flat[i, j])
                          for i in range(k_num)) / k_num
                per_query += scores[b, q, j] * w_j
            total += per_query / k_num
    return gamma * total / (b_num * q_num)


def test_matches_formula_on_hand_made_tensors():
    scores = np.array([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]],
                       [[2.0, 0.0, 1.5, -0.5], [-1.0, -1.0, 4.0, 0.25]]])
    sample = np.stack([sample_prior(K, [0, 2]), sample_prior(K, [1])])
    prior = np.array([[[1.0, 0.9, 0.2, 0.5], [0.1, 1.0, 0.7, 0.4],
                       [0.8, 0.3, 1.0, 0.6], [0.0, 0.5, 0.9, 1.0]],
                      [[1.0, 0.2, 0.4, 0.5], [0.6, 1.0, 0.5, 0.1],
                       [0.3, 0.9, 1.0, 0.0], [0.5, 0.7, 0.5, 1.0]]])
    loss = LoMaLoss(loss_weight=20.0)(torch.tensor(scores),
                                      torch.tensor(prior),
                                      torch.tensor(sample))
    expected = formula(scores, prior, sample, 20.0)
    assert expected != 0
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_weights_and_reductions():
    scores = torch.randn(2, 3, K, dtype=torch.float64)
    sample = torch.tensor(np.stack([sample_prior(K, [0, 1])] * 2))
    prior = torch.rand(2, K, K, dtype=torch.float64)
    loss_fn = LoMaLoss(loss_weight=1.0)
    w = loma_class_weights(prior, sample)
    per_query = (scores * w[:, None]).mean(-1)
    none = loss_fn(scores, prior, sample, reduction_override='none')
    torch.testing.assert_close(none, per_query)
    torch.testing.assert_close(
        loss_fn(scores, prior, sample, reduction_override='sum'),
        per_query.sum())
    # averaging over selected (e.g. matched) queries only
    weight = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]],
                          dtype=torch.float64)
    torch.testing.assert_close(
        loss_fn(scores, prior, sample, weight=weight, avg_factor=3),
        (per_query * weight).sum() / 3)
    # a background channel beyond K is ignored
    padded = torch.cat([scores, torch.randn(2, 3, 1, dtype=scores.dtype)], -1)
    torch.testing.assert_close(
        loss_fn(padded, prior, sample), loss_fn(scores, prior, sample))
    with pytest.raises(ValueError):
        LoMaLoss(reduction='max')


@pytest.mark.parametrize('agree', [True, False])
def test_gradient_direction(agree):
    present = [0, 2]  # classes 1 and 3 are absent from the image
    stats = sample_prior(K, present)
    injected = stats if agree else flip_prior(stats)
    scores = torch.zeros(1, 5, K, dtype=torch.float64, requires_grad=True)
    loss = LoMaLoss()(scores, torch.tensor(injected)[None],
                      torch.tensor(stats)[None])
    loss.backward()
    grad = scores.grad[0]
    for j in present:
        # gradient descent moves s_j by -grad: up when E agrees with E_x
        if agree:
            assert (grad[:, j] < 0).all()
        else:
            assert (grad[:, j] > 0).all()
    for j in (1, 3):
        assert torch.equal(grad[:, j], torch.zeros(5, dtype=torch.float64))


def test_flat_prior_or_empty_image_gives_zero():
    scores = torch.randn(1, 4, K)
    flat = torch.full((1, K, K), 0.5)
    flat[:, range(K), range(K)] = 1.0
    stats = torch.tensor(sample_prior(K, [1, 2]), dtype=torch.float32)[None]
    assert LoMaLoss()(scores, flat, stats).item() == 0.0
    empty = torch.tensor(sample_prior(K, []), dtype=torch.float32)[None]
    assert LoMaLoss()(scores, torch.rand(1, K, K), empty).item() == 0.0
