# Copyright (c) mmcalidet contributors. All rights reserved.
"""Support helpers of the experimental support-aware prior."""
import math

import torch

from mmcalidet.models.layers.support_ops import (check_support, shrunk_lift,
                                                 support_features)
from mmcalidet.priors import batch_prior, sample_prior

K = 5


def test_shrunk_lift_is_zero_on_every_image_prior():
    for labels in ([], [0], [1, 3], [0, 1, 2, 3, 4], [4, 4, 2]):
        prior = torch.from_numpy(sample_prior(K, labels)).float()[None]
        share = torch.zeros(1, K)
        share[0, labels] = 1.0
        lift = shrunk_lift(prior, torch.ones(1, K), share, 0.05)
        assert torch.equal(lift, torch.zeros(1, K, K))


def test_shrunk_lift_formula_on_a_site():
    lists = [[0, 1], [0, 1], [0], [2]]
    prior = torch.from_numpy(batch_prior(K, lists)).float()[None]
    share = torch.tensor([[0.75, 0.5, 0.25, 0.0, 0.0]])
    support = torch.full((1, K), 4.0)
    lift = shrunk_lift(prior, support, share, 0.1)
    # P(1 | 0) = 2/3, P(1) = 1/2
    assert math.isclose(
        lift[0, 1, 0].item(), math.log((2 / 3 + 0.1) / 0.6), rel_tol=1e-6)
    assert torch.equal(lift[0, :, 3], torch.zeros(K))  # class 3 never seen
    assert torch.equal(torch.diagonal(lift[0]), torch.zeros(K))


def test_support_features_and_broadcast():
    support = check_support(
        torch.tensor([0.0, 1, 3, 7, 255]), 2, K, 'support', torch.zeros(1))
    assert support.shape == (2, K)
    feats = support_features(support)
    assert feats.shape == (2, K, 2)
    assert torch.equal(feats[..., 1], torch.zeros(2, K))
    assert math.isclose(feats[0, 4, 0].item(), math.log(256.0), rel_tol=1e-6)
    assert check_support(None, 2, K, 'support', torch.zeros(1)) is None
