# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior's support (experimental) where the detector takes E:
``set_prior(support=...)``, the data samples' ``prior_support``, and the
support a prior file records (``num_images``, ``images_per_class``),
which travels with the file to ``set_prior`` and the inference calls."""
import contextlib

import numpy as np
import pytest
import torch

from mmcalidet.apis import init_detector
from mmcalidet.priors import sample_prior, save_prior
from testing import get_config, random_prior

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


@pytest.mark.parametrize('support, marginals, match', [
    (np.ones(K - 1), np.zeros(K), 'support must have shape'),
    (-np.ones(K), np.zeros(K), 'support must be >= 0'),
    (np.full(K, np.nan), np.zeros(K), 'support must be finite'),
    ('abc', np.zeros(K), 'support must be numbers'),
    (np.ones(K), np.full(K, 7.0), r'marginals \(class shares\) must lie'),
    (np.ones(K), None, 'a support without marginals'),
    (None, np.zeros(K), 'marginals without a support'),
])
def test_bad_support_raises_and_keeps_the_prior(model, support, marginals,
                                                match):
    """A support is given whole (both arrays) and valid, or refused in one
    line before the prior changes."""
    prior = sample_prior(K, [2])
    with pytest.raises(ValueError, match=match):
        model.set_prior(prior, support=support, marginals=marginals)
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


@contextlib.contextmanager
def support_read(model):
    """The support branch made non-zero (at initialisation it is zero, so
    V' would not show whether the support arrived)."""
    califormer = model.bbox_head.califormer
    with torch.no_grad():
        califormer.support_proj.weight.fill_(0.1)
    try:
        yield
    finally:
        with torch.no_grad():
            califormer.support_proj.weight.zero_()
        model.set_prior(None)


def write_site_prior(path, classes, counts, num_images=10):
    """A prior file in reversed class order, recording its support."""
    prior = random_prior(3, K)
    order = list(range(K))[::-1]
    save_prior(
        str(path),
        prior[np.ix_(order, order)], [classes[i] for i in order],
        num_images=num_images,
        images_per_class={c: counts[i]
                          for i, c in enumerate(classes)})
    return prior


def test_a_prior_file_carries_its_recorded_support(model, tmp_path):
    classes = list(model.dataset_meta['classes'])
    counts = [i % 7 for i in range(K)]
    path = tmp_path / 'site.json'
    prior = write_site_prior(path, classes, counts)
    with support_read(model):
        model.set_prior(str(path))
        np.testing.assert_allclose(model.get_prior(), prior, atol=1e-6)
        support, share = model.deployment_support()
        assert torch.equal(support, torch.full((K, ), 10.0))
        expected = np.array(counts) / 10.0  # in the model's class order
        np.testing.assert_allclose(share.numpy(), expected, atol=1e-6)
        from_file = model.deployment_cali_vectors().clone()
        model.set_prior(prior, support=np.full(K, 10.0), marginals=expected)
        torch.testing.assert_close(model.deployment_cali_vectors(),
                                   from_file)
        model.set_prior(prior)  # a bare matrix records no support
        assert model.deployment_support() == (None, None)
        assert not torch.equal(model.deployment_cali_vectors(), from_file)


@pytest.mark.parametrize('num_images, counts, match', [
    (10, {'person': 11}, "images_per_class\\['person'\\] exceeds"),
    (0, {}, 'num_images must be a positive number'),
    (10, {'person': -1}, 'finite counts >= 0'),
    (10, {'person': 'many'}, 'must be numbers'),
])
def test_a_wrong_recorded_support_is_refused_and_keeps_the_prior(
        model, tmp_path, num_images, counts, match):
    classes = list(model.dataset_meta['classes'])
    full = {c: 1 for c in classes}
    full.update(counts)
    path = tmp_path / 'site.json'
    save_prior(str(path), random_prior(4, K), classes,
               num_images=num_images, images_per_class=full)
    before = model.get_prior()
    with pytest.raises(ValueError, match=match):
        model.set_prior(str(path))
    np.testing.assert_array_equal(model.get_prior(), before)
    missing = dict(full)
    del missing['zebra']
    save_prior(str(path), random_prior(4, K), classes, num_images=10,
               images_per_class=missing)
    with pytest.raises(ValueError, match="no count for 'zebra'"):
        model.set_prior(str(path))


def test_a_model_that_reads_no_support_ignores_the_record(tmp_path):
    cfg = get_config(CONFIG)
    plain = init_detector(cfg, None, device='cpu').eval()
    assert not plain.reads_prior_support
    classes = list(plain.dataset_meta['classes'])
    path = tmp_path / 'site.json'
    write_site_prior(path, classes, [1] * K)
    plain.set_prior(str(path))
    assert plain.deployment_support() == (None, None)
    # carried whole, read by none of the model's CaliFormer
    assert plain.resolve(str(path)).has_support
    assert plain.current_prior().has_support


def test_a_call_prior_file_takes_its_support_to_the_images(model, tmp_path):
    """inference_detector(prior=file) and the inferencer put the file's
    support in the data samples: the same V' as set_prior(file)."""
    from mmcalidet.apis import (CaliDetInferencer, call_prior_fields,
                                inference_detector, resolve_call_priors)
    classes = list(model.dataset_meta['classes'])
    path = str(tmp_path / 'site.json')
    prior = write_site_prior(path, classes, [i % 5 for i in range(K)])
    fields = call_prior_fields(
        model, resolve_call_priors(model, [path, None, prior], 3))
    assert fields[1] is None and 'prior_support' not in fields[2]
    assert torch.equal(fields[0]['prior_support'], torch.full((K, ), 10.))
    seen = []
    head = model.bbox_head
    original = head.get_cali_vectors

    def record(priors, support=None, marginals=None):
        seen.append(None if support is None else support.clone())
        return original(priors, support, marginals)

    image = np.random.default_rng(0).integers(
        0, 255, (64, 64, 3), dtype=np.uint8)
    head.get_cali_vectors = record
    try:
        with support_read(model):
            inference_detector(model, image, prior=path)
            assert seen and seen[-1] is not None
            assert torch.equal(seen[-1], torch.full((1, K), 10.0))
            cfg = get_config(CONFIG)
            cfg.model.bbox_head.califormer.update(support_features=True,
                                                  lift_bias=True)
            inferencer = CaliDetInferencer(model=cfg, device='cpu',
                                           show_progress=False)
            inferencer.model = model  # the weights under test
            inferencer(image, prior=path, return_datasamples=True)
            assert torch.equal(seen[-1], torch.full((1, K), 10.0))
            inference_detector(model, image, prior=prior)
            assert seen[-1] is None  # a matrix: today's V'
    finally:
        del head.get_cali_vectors


def build_support_model(prior='coco2017_train'):
    cfg = get_config(CONFIG)
    cfg.model.bbox_head.califormer.update(support_features=True,
                                          lift_bias=True)
    cfg.model.prior = prior
    return init_detector(cfg, None, device='cpu').eval()


def test_e_t_takes_the_support_its_file_records():
    import json

    from mmcalidet.priors import default_prior_path
    model = build_support_model()
    meta = json.load(open(default_prior_path('coco2017_train')))
    support, share = model.deployment_support()
    assert torch.equal(support, torch.full((K, ), float(meta['num_images'])))
    person = model.dataset_meta['classes'].index('person')
    assert share[person].item() == pytest.approx(
        meta['images_per_class']['person'] / meta['num_images'])


def test_a_checkpoint_keeps_the_support_beside_the_prior():
    model = build_support_model()
    state = model.state_dict()
    assert torch.equal(state['prior_support'], model.prior_support)
    fresh = build_support_model(prior=None)  # E0: no support
    assert fresh.deployment_support() == (None, None)
    fresh.load_state_dict(state)
    for got, want in zip(fresh.deployment_support(),
                         model.deployment_support()):
        assert torch.equal(got, want)
    plain = init_detector(get_config(CONFIG), None, device='cpu')
    assert 'prior_support' not in plain.state_dict()


def test_a_checkpoint_without_support_keeps_it_only_for_the_same_prior():
    model = build_support_model()
    state = {
        k: v
        for k, v in model.state_dict().items()
        if k not in ('prior_support', 'prior_marginals')
    }
    model.load_state_dict(state)  # the same E_t: its support stays
    assert model.deployment_support()[0] is not None
    state['prior'] = torch.from_numpy(random_prior(5, K)).float()
    model.load_state_dict(state)  # another prior: no support known
    assert model.deployment_support() == (None, None)
    state['prior_support'] = torch.full((K - 1, ), 3.0)
    state['prior_marginals'] = torch.zeros(K - 1)
    with pytest.raises(ValueError, match='support must have shape'):
        model.load_state_dict(state)
