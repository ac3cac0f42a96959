# Copyright (c) mmcalidet contributors. All rights reserved.
"""The EdgeSampler's experimental support and ``'sim_site'`` mode (issue
49)."""
import numpy as np
import pytest
import torch

from mmcalidet.models import EdgeSampler
from mmcalidet.priors import batch_prior, sample_prior
from testing import demo_batch

K = 8
LABELS = [[0, 1, 1], [2], [], [1, 3, 5]]


def dataset_prior():
    prior = np.random.default_rng(0).uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def sampler(mode, **kwargs):
    kwargs.setdefault('noise_std', 0.0)
    return EdgeSampler(
        num_classes=K,
        prior=dataset_prior(),
        mode_probs={mode: 1.0},
        seed=0,
        **kwargs)


def run(edge_sampler, labels=LABELS, seed=0):
    batch = demo_batch(labels, size=8, seed=seed)
    inputs = torch.stack(batch['inputs']).float()
    return edge_sampler(inputs, batch['data_samples'])[1]


def test_off_by_default_adds_no_fields():
    for s in run(sampler('batch')):
        assert 'prior_support' not in s
        assert 'prior_marginals' not in s


def test_support_on_leaves_the_priors_unchanged():
    for mode in ('sample', 'batch', 'dataset'):
        off = run(sampler(mode, noise_std=0.16))
        on = run(sampler(mode, noise_std=0.16, support=True))
        for a, b in zip(off, on):
            assert torch.equal(a.prior, b.prior)


def test_sample_mode_support_is_one_and_shares_are_labels():
    for s, labels in zip(run(sampler('sample', support=True)), LABELS):
        assert s.prior_support.shape == (K, )
        assert torch.equal(s.prior_support, torch.ones(K))
        expected = np.zeros(K)
        expected[labels] = 1.0
        np.testing.assert_array_equal(s.prior_marginals.numpy(), expected)


def test_batch_mode_support_is_the_batch_size():
    for s in run(sampler('batch', support=True)):
        assert torch.equal(s.prior_support, torch.full((K, ), 4.0))
        np.testing.assert_allclose(s.prior_marginals[1].item(), 0.5)


def test_site_mode_draws_fractional_priors_with_support_in_range():
    edge = sampler('sim_site', support=True, site_support=(1, 256))
    rng = np.random.default_rng(1)
    seen, fractional = [], []
    for step in range(40):
        labels = [
            list(rng.choice(K, size=rng.integers(1, 4), replace=False))
            for _ in range(4)
        ]
        samples = run(edge, labels, seed=step)
        n = samples[0].prior_support
        assert torch.equal(n, n[0].expand(K))  # one site: one n
        n = int(n[0])
        assert 1 <= n <= 256
        prior = samples[0].prior.numpy()
        assert prior.min() >= 0.0 and prior.max() <= 1.0
        np.testing.assert_array_equal(np.diag(prior), np.ones(K))
        share = samples[0].prior_marginals.numpy()
        assert share.min() >= 0.0 and share.max() <= 1.0
        seen.append(n)
        off = prior[~np.eye(K, dtype=bool)]
        fractional.append(np.mean((off > 0) & (off < 1) & (off != 0.5)))
    seen = np.array(seen)
    assert seen.min() < 16 and seen.max() > 16  # log-uniform spread
    assert np.mean(np.array(fractional)[seen >= 32]) > 0.1


def test_site_draw_is_the_statistics_of_its_label_sets():
    edge = sampler('sim_site', support=True)
    run(edge)
    site = edge.site_label_lists(123)
    np.testing.assert_allclose(
        edge.sample_priors('sim_site', LABELS, 123)[0], batch_prior(K, site))
    support, share = edge.sample_support('sim_site', LABELS, 123)
    assert support[0, 0] == len(site)
    # a site of one image is that image's E_x
    one = sampler('sim_site', support=True, site_support=(1, 1))
    run(one)
    labels = one.site_label_lists(7)
    assert len(labels) == 1
    np.testing.assert_array_equal(
        one.sample_priors('sim_site', LABELS, 7)[0],
        sample_prior(K, labels[0]))


@pytest.mark.parametrize('kwargs, match', [
    (dict(site_support=(0, 4)), 'site_support'),
    (dict(site_support=(8, 4)), 'site_support'),
    (dict(site_tilt_std=-1.0), 'site_tilt_std'),
    (dict(site_tilt_std=float('nan')), 'site_tilt_std'),
    (dict(site_bank_size=0), 'site_bank_size'),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sampler('sim_site', support=True, **kwargs)


def test_site_mode_without_images_raises():
    with pytest.raises(ValueError, match='no training images'):
        sampler('sim_site').site_label_lists(0)


def test_a_subclass_mode_keeps_its_priors_and_gets_no_support():
    """A subclass's own mode (e.g. the context-shift project's 'site') is
    not the 'sim_site' mode: its priors are its own, without support."""

    class OwnMode(EdgeSampler):
        KNOWN_MODES = dict(EdgeSampler.KNOWN_MODES, site='own')

        def _distinct_priors(self, mode, label_lists):
            if mode != 'site':
                return super()._distinct_priors(mode, label_lists)
            return np.full((1, K, K), 0.25), np.zeros(
                len(label_lists), dtype=np.int64)

    edge = OwnMode(
        num_classes=K,
        prior=dataset_prior(),
        mode_probs=dict(site=1.0),
        noise_std=0.0,
        support=True)
    for s in run(edge):
        off = s.prior.numpy()[~np.eye(K, dtype=bool)]
        np.testing.assert_array_equal(off, np.full(K * K - K, 0.25))
        assert 'prior_support' not in s
