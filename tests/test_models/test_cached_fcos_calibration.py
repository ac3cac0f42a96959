# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on a CaliFCOS's cached locations, through the dense
head kind's adapter and the FCOS family: each location's feature is the
3 x 3 conv's input over its kernel; the cached focal loss and LoMa are the
head's on images; V' = 0 gives the plain FCOS's logits; only the
calibrator learns; the config builds the written-out CachedCaliFCOS."""
import copy

import numpy as np
import pytest
import torch
from mmdet.models.dense_heads import FCOSHead

from mmcalidet.decoder_cache import DecoderCacheWriter, fill_dense_cache
from mmcalidet.models.detectors import (CachedCalibrationMixin, CachedCaliFCOS,
                                        CaliFCOS)
from mmcalidet.models.head_kinds import DENSE
from mmcalidet.models.head_kinds.dense import location_features
from testing import build_detector, demo_batch, get_config, random_prior

CONFIG = 'calidet/calidet_fcos_tiny_coco-mini_cached.py'
BASELINE = 'calidet/fcos_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ), (0, 5, 7))
#: a 64 px image has 8 x 8 + 4 x 4 + 2 x 2 + 1 + 1 locations
ALL = 86


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


@pytest.fixture(scope='module')
def baseline():
    return build_detector(BASELINE, seed=1).eval()


def dense_cache(detector, labels=LABELS, num_locations=40):
    batches = [
        demo_batch(labels[s:s + 3], size=64, seed=s)
        for s in range(0, len(labels), 3)
    ]
    writer = DecoderCacheWriter(None, fingerprint=dict(test=1))
    return fill_dense_cache(
        detector, batches, writer, num_locations, seed=0, progress=False)


def batch_inputs(cache):
    return dict(
        hidden_states=torch.as_tensor(cache.hidden).transpose(0, 1),
        bbox_preds=torch.as_tensor(cache.boxes).transpose(0, 1),
        targets=torch.as_tensor(cache.targets))


def test_the_cache_holds_each_locations_kernel_window(baseline):
    cache = dense_cache(baseline)
    d = baseline.bbox_head.feat_channels
    assert cache.meta['head'] == 'dense' and cache.meta['num_levels'] == 5
    assert cache.hidden.shape == (3, 1, 40, d * 9)
    level, label, score, weight = np.moveaxis(cache.targets, -1, 0)
    pos = (label < 80) & (weight > 0)
    for i, labels in enumerate(LABELS):
        assert set(label[i][pos[i]]) <= set(labels) and pos[i].any()
        # the sampled negatives weighted up to the image's 86 locations
        np.testing.assert_allclose(weight[i].sum(), ALL, rtol=1e-5)
    assert set(np.unique(level)) <= set(range(5))


def test_cached_loss_is_the_head_loss_on_all_locations(model):
    model = copy.deepcopy(model).eval()
    head = model.bbox_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*head.califormer.parameters(), *head.cls_convs.parameters()]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model.set_prior(random_prior(3))
    labels = LABELS[2:]
    cache = dense_cache(model, labels=labels, num_locations=ALL + 4)
    data = model.data_preprocessor(demo_batch(labels, size=64), False)
    samples = data['data_samples']
    priors = model.prior[None]
    cali = model.deployment_cali_vectors()
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        with head.calibrated(cali, priors):
            expected = head.loss(feats, samples)
        inputs = batch_inputs(cache)
        got = DENSE.cached_losses(
            head, inputs, samples, cali, priors, train_cls=False)
        samples[0].prior = model.prior.clone()
        by_model = model.loss(batch_inputs(cache), samples)
    torch.testing.assert_close(got['loss_cls'], expected['loss_cls'])
    torch.testing.assert_close(got['loss_loma'], expected['loss_loma'])
    assert expected['loss_loma'] != 0
    for key in ('loss_cls', 'loss_loma'):
        torch.testing.assert_close(by_model[key], got[key])


def test_zero_v_prime_gives_the_baselines_logits(model, baseline):
    calibrator = copy.deepcopy(model)
    calibrator.load_state_dict(baseline.state_dict(), strict=False)
    head, plain = calibrator.bbox_head, baseline.bbox_head
    cache = dense_cache(baseline, labels=LABELS[:1], num_locations=ALL)
    data = baseline.data_preprocessor(demo_batch(LABELS[:1], size=64), False)
    with torch.no_grad(), DENSE.recording_calls(plain) as calls:
        feats = baseline.extract_feat(data['inputs'])
        scores = FCOSHead.forward(plain, feats)[0]
        scores = torch.cat([s.flatten(2) for s in scores], 2)[0].t()
        flat = torch.cat(
            [location_features(plain.conv_cls, x) for x, _ in calls], 1)[0]
        inputs = batch_inputs(cache)
        cali = head.get_cali_vectors(
            torch.as_tensor(random_prior(4), dtype=torch.float32))
        got = DENSE.calibrated_logits(head, inputs['hidden_states'][0],
                                      inputs['targets'][..., 0], cali)[0]
    assert torch.equal(cali, torch.zeros_like(cali))
    # each cached window is one of the map's (the 1 x 1 levels' windows
    # are all padding but their centre), its logits the head's there
    same = (inputs['hidden_states'][0, 0, :, None] == flat[None]).all(-1)
    assert (same.sum(1) >= 1).all()
    where = same.float().argmax(1)
    torch.testing.assert_close(got, scores[where], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('train_cls', [False, True])
def test_gradients_reach_the_calibrator_only(baseline, train_cls):
    model = build_detector(CONFIG, seed=0, cache_train_cls_branches=train_cls)
    cache = dense_cache(baseline)
    losses = model.loss(batch_inputs(cache), copy.deepcopy(cache.data_samples))
    assert set(losses) == {'loss_cls', 'loss_loma'}
    sum(losses.values()).backward()
    with_grad = {
        '.'.join(name.split('.')[:2])
        for name, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    expected = {'bbox_head.califormer'}
    if train_cls:
        expected.add('bbox_head.conv_cls')
    assert with_grad == expected
    assert set(model.calibrator_modules()) == expected


def test_the_config_builds_the_written_out_twin(model):
    cfg = get_config(CONFIG)
    assert cfg.model.type == 'CachedCalibration'
    assert cfg.model.detector == 'CaliFCOS'
    assert type(model) is CachedCaliFCOS
    assert isinstance(model, CaliFCOS)
    assert isinstance(model, CachedCalibrationMixin)
    # named as the detector (reports, exports), found by its qualified name
    assert type(model).__name__ == 'CaliFCOS'
    assert type(model).__qualname__ == 'CachedCaliFCOS'
    assert model.cache_kind() == 'dense'
    assert model.cache_width() == model.bbox_head.feat_channels * 9
