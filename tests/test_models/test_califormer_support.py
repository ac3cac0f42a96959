# Copyright (c) mmcalidet contributors. All rights reserved.
"""The CaliFormer's experimental support options."""
import copy

import pytest
import torch

from mmcalidet.models import CaliFormer
from mmcalidet.priors import sample_prior

K, D = 6, 16
LABELS = [[0, 2], [1], [3, 4, 5]]


def build(seed=0, **kwargs):
    torch.manual_seed(seed)
    model = CaliFormer(
        num_classes=K,
        embed_dims=D,
        num_layers=2,
        num_heads=2,
        feedforward_channels=32,
        **kwargs)
    model.init_weights()
    with torch.no_grad():
        model.nodes.normal_()
    return model.eval()


def image_prior(labels):
    """E_x, n = 1 per column and p = the label vector."""
    prior = torch.from_numpy(sample_prior(K, labels)).float()
    share = torch.zeros(K)
    share[labels] = 1.0
    return prior, torch.ones(K), share


def random_site(seed):
    gen = torch.Generator().manual_seed(seed)
    prior = torch.rand(K, K, generator=gen)
    prior.fill_diagonal_(1.0)
    support = torch.randint(1, 257, (K, ), generator=gen).float()
    share = torch.rand(K, generator=gen)
    return prior, support, share


def test_shapes_single_and_batch():
    model = build(support_features=True, lift_bias=True)
    prior, support, share = random_site(0)
    assert model(prior, support, share).shape == (K, D)
    priors = torch.stack([random_site(s)[0] for s in range(3)])
    supports = torch.stack([random_site(s)[1] for s in range(3)])
    out = model(priors, supports, share)  # (K,) marginals broadcast
    assert out.shape == (3, K, D)


def test_option_off_is_bit_identical_and_ignores_support():
    base = build(seed=1)
    off = build(seed=1, support_features=False, lift_bias=False)
    prior, support, share = random_site(2)
    want = base(prior)
    assert torch.equal(off(prior), want)
    assert torch.equal(off(prior, support, share), want)


@pytest.mark.parametrize('flags', [
    dict(support_features=True),
    dict(lift_bias=True),
    dict(support_features=True, lift_bias=True),
])
def test_option_on_at_init_equals_off_for_an_image_prior(flags):
    base = build(seed=3)
    on = build(seed=3, **flags)
    for labels in LABELS:
        prior, support, share = image_prior(labels)
        assert torch.equal(on(prior, support, share), base(prior))
    # without support the option changes nothing either
    prior = random_site(4)[0]
    assert torch.equal(on(prior), base(prior))


def test_trained_lift_still_ignores_an_image_prior():
    base = build(seed=5)
    on = build(seed=5, lift_bias=True)
    with torch.no_grad():
        on.lift_scale.fill_(3.0)
    prior, support, share = image_prior(LABELS[0])
    assert torch.equal(on(prior, support, share), base(prior))
    # and it moves V' on a fractional site prior
    site = random_site(6)
    assert not torch.equal(on(*site), base(site[0]))


def test_support_features_reach_v_prime_once_trained():
    on = build(seed=7, support_features=True)
    with torch.no_grad():
        on.support_proj.weight.fill_(0.5)
    prior, _, share = random_site(8)
    few = on(prior, torch.ones(K), share)
    many = on(prior, torch.full((K, ), 200.0), share)
    assert not torch.equal(few, many)


def test_a_zero_support_row_is_no_support():
    """n = 0 everywhere (measured on no image, e.g. an ONNX support input
    of zeros) gives the V' without a support, row by row in a batch."""
    on = build(seed=7, support_features=True, lift_bias=True)
    with torch.no_grad():
        on.support_proj.weight.fill_(0.5)
        on.support_proj.bias.fill_(0.3)
        on.lift_scale.fill_(1.0)
    prior, support, share = random_site(8)
    without = on(prior)
    torch.testing.assert_close(on(prior, torch.zeros(K), share), without)
    batch = on(
        torch.stack([prior, prior]), torch.stack([torch.zeros(K), support]),
        torch.stack([share, share]))
    torch.testing.assert_close(batch[0], without)
    assert not torch.allclose(batch[1], without)


def test_permuting_classes_permutes_v_prime():
    model = build(seed=9, support_features=True, lift_bias=True)
    with torch.no_grad():
        model.support_proj.weight.normal_()
        model.lift_scale.fill_(1.0)
    prior, support, share = random_site(10)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    # the nodes V are per class: they are permuted with (E, n, p)
    permuted_model = copy.deepcopy(model)
    with torch.no_grad():
        permuted_model.nodes.copy_(model.nodes[perm])
    out = model(prior, support, share)
    permuted = permuted_model(prior[perm][:, perm], support[perm], share[perm])
    torch.testing.assert_close(permuted, out[perm], rtol=1e-5, atol=1e-5)


def test_batch_dedup_keeps_support_apart():
    model = build(seed=11, support_features=True)
    with torch.no_grad():
        model.support_proj.weight.fill_(0.5)
    prior, _, share = random_site(12)
    priors = prior.expand(2, -1, -1)
    supports = torch.stack([torch.ones(K), torch.full((K, ), 100.0)])
    few, many = (model(prior, s, share) for s in supports)
    # the two supports move V' far beyond float rounding...
    assert (few - many).abs().max() > 1e-2
    # ...so a batch that merged them cannot match both within rounding (a
    # batched matmul may reduce in another order than a single one: close,
    # not bit-equal, with more than one thread)
    out = model(priors, supports, share)
    torch.testing.assert_close(out[0], few, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], many, rtol=1e-5, atol=1e-5)
    # rows with equal support are computed once: bit-identical
    out = model(prior.expand(3, -1, -1), supports[[0, 1, 0]], share)
    assert torch.equal(out[0], out[2])
    assert not torch.equal(out[0], out[1])


@pytest.mark.parametrize('support, marginals, match', [
    (torch.ones(K + 1), None, 'support must have shape'),
    (torch.ones(2, K), None, 'support must have shape'),
    (-torch.ones(K), None, 'support must be >= 0'),
    (torch.full((K, ), float('nan')), None, 'support must be finite'),
    (torch.ones(K), torch.full(
        (K, ), float('nan')), 'marginals must be finite'),
    (torch.ones(K), torch.full((K, ), 1.5), r'marginals must lie in'),
])
def test_bad_support_raises(support, marginals, match):
    model = build(support_features=True)
    with pytest.raises(ValueError, match=match):
        model(random_site(0)[0], support, marginals)


def test_bad_lift_shrink_raises():
    with pytest.raises(ValueError, match='lift_shrink'):
        build(lift_bias=True, lift_shrink=0.0)
    with pytest.raises(ValueError, match='lift_shrink'):
        build(lift_bias=True, lift_shrink=float('nan'))
