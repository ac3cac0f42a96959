# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior's support (experimental) where the detector takes E:
``set_prior(support=...)`` and the data samples' ``prior_support``."""
import numpy as np
import pytest
import torch

from mmcalidet.apis import init_detector
from mmcalidet.priors import sample_prior
from mmcalidet.testing import get_config

CONFIG = 'calidet/calidet_dino_tiny_coco-mini_cached.py'
K = 80


@pytest.fixture(scope='module')
def model():
    cfg = get_config(CONFIG)
    cfg.model.bbox_head.califormer.update(
        support_features=True, lift_bias=True, zero_init_output=False)
    torch.manual_seed(0)
    return init_detector(cfg, None, device='cpu').eval()


def image_prior(labels):
    share = np.zeros(K)
    share[labels] = 1.0
    return sample_prior(K, labels), np.ones(K), share


def test_set_prior_support_reaches_v_prime(model):
    califormer = model.bbox_head.califormer
    prior, support, share = image_prior([1, 4])
    model.set_prior(prior)
    plain = model.deployment_cali_vectors().clone()
    model.set_prior(prior, support=support, marginals=share)
    # at initialisation the support branches are zero
    assert torch.equal(model.deployment_cali_vectors(), plain)
    with torch.no_grad():
        califormer.support_proj.weight.fill_(0.1)
    try:
        with_support = model.deployment_cali_vectors().clone()
        assert not torch.equal(with_support, plain)
        model.set_prior(prior)  # no support: today's V'
        assert not torch.equal(model.deployment_cali_vectors(), with_support)
    finally:
        with torch.no_grad():
            califormer.support_proj.weight.zero_()
        model.set_prior(None)


@pytest.mark.parametrize('support, match', [
    (np.ones(K - 1), 'support must have shape'),
    (-np.ones(K), 'support must be >= 0'),
    (np.full(K, np.nan), 'support must be finite'),
])
def test_bad_support_raises_and_keeps_the_prior(model, support, match):
    prior = sample_prior(K, [2])
    with pytest.raises(ValueError, match=match):
        model.set_prior(prior, support=support)
    np.testing.assert_array_equal(model.get_prior(),
                                  sample_prior(K, [])), 'prior unchanged'


def test_batch_support_stacks_the_samples(model):
    from mmdet.structures import DetDataSample
    samples = [DetDataSample() for _ in range(2)]
    assert model.batch_support(samples) == (None, None)
    for k, ds in enumerate(samples):
        ds.prior_support = torch.full((K, ), float(k + 1))
    support, marginals = model.batch_support(samples)
    assert support.shape == (2, K) and marginals is None
    assert torch.equal(support[1], torch.full((K, ), 2.0))
    samples.append(DetDataSample())
    with pytest.raises(ValueError, match='prior_support'):
        model.batch_support(samples)
