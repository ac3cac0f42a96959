# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliRTMDet, CaliDet on a one-stage detector: builds from its config,
starts as RTMDet, calibrates every level's classification conv with one V'
(shared or per image), is equivariant to a permutation of the classes,
puts LoMa on the assigned class of the positive locations, trains and
refuses a bad prior."""
import copy

import pytest
import torch
from mmdet.models.dense_heads import RTMDetSepBNHead
from mmdet.registry import MODELS

from mmcalidet.models.dense_heads import CalibratedDenseClsMixin
from mmcalidet.models.detectors import CalibratableSingleStageMixin
from mmcalidet.models.layers import CalibratedConv2d
from mmcalidet.models.losses import loma_class_weights
from mmcalidet.priors import label_lists_prior
from testing import (build_detector, check_bad_priors_refused,
                     check_califormer_trains, check_inference_priors,
                     demo_batch, get_config, random_prior)

CONFIG = 'calidet/calidet_rtmdet_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ))


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


@pytest.fixture
def answering(model):
    """The model with a CaliFormer whose V' is not 0 and classification
    towers whose features are not (the random init's are near 0), restored
    after."""
    head = model.bbox_head
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*head.califormer.parameters(), *head.cls_convs.parameters()]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None


def features(model, labels=LABELS, size=64):
    model.eval()
    data = model.data_preprocessor(demo_batch(labels, size=size), False)
    with torch.no_grad():
        return model.extract_feat(data['inputs']), data['data_samples']


def cls_tower(head, feats):
    """The input of every level's classification conv, by hand."""
    out = []
    for level, x in enumerate(feats):
        for layer in head.cls_convs[level]:
            x = layer(x)
        out.append(x)
    return out


def prior_of(labels, k=80):
    return torch.as_tensor(
        label_lists_prior([list(labels)], k)[0], dtype=torch.float32)


def test_builds_from_its_config_through_the_registries(model):
    cfg = get_config(CONFIG)
    assert MODELS.get(cfg.model.type) is type(model)
    assert isinstance(model, CalibratableSingleStageMixin)
    head = model.bbox_head
    assert isinstance(head, CalibratedDenseClsMixin)
    assert isinstance(head, RTMDetSepBNHead)
    assert set(
        head.dense_cls_convs()) == {'rtm_cls.0', 'rtm_cls.1', 'rtm_cls.2'}
    assert all(
        isinstance(c, CalibratedConv2d)
        for c in head.dense_cls_convs().values())
    # V' has the width of the features the classification convs read
    assert head.get_cali_vectors(head.flat_priors(torch.zeros(1))).shape == \
        (80, head.feat_channels)
    # the parameters keep RTMDet's names: a plain RTMDet checkpoint loads
    assert 'bbox_head.rtm_cls.0.weight' in model.state_dict()


def test_starts_as_rtmdet_whatever_the_prior(model):
    feats, samples = features(model)
    head = model.bbox_head
    with torch.no_grad():
        plain_cls, plain_box = RTMDetSepBNHead.forward(head, feats)
        for prior in (prior_of([1, 2]), torch.as_tensor(random_prior(3))):
            model.set_prior(prior.numpy())
            cls, box = head(feats, model.deployment_cali_vectors())
            for a, b in zip(cls + box, plain_cls + plain_box):
                torch.testing.assert_close(a, b)
    model.set_prior(None)


def test_every_level_reads_one_v_prime_shared_or_per_image(answering):
    model = answering
    feats, _ = features(model)
    head = model.bbox_head
    priors = torch.stack([prior_of([1, 2]), prior_of([3])])
    with torch.no_grad():
        plain_cls, plain_box = RTMDetSepBNHead.forward(head, feats)
        towers = cls_tower(head, feats)
        cali = head.get_cali_vectors(priors)
        per_image_cls, box = head(feats, cali)
        for level, tower in enumerate(towers):
            expected = plain_cls[level] + head.rho * torch.einsum(
                'bdhw,bkd->bkhw', tower, cali)
            torch.testing.assert_close(
                per_image_cls[level], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(box[level], plain_box[level])
        # one shared V' (folded into the conv weight) gives image b what
        # the per-image path gives it under the same prior
        shared_cls, _ = head(feats, cali[0])
        for level in range(len(feats)):
            torch.testing.assert_close(
                shared_cls[level][0],
                per_image_cls[level][0],
                atol=1e-5,
                rtol=1e-5)
            assert not torch.allclose(
                shared_cls[level][1], per_image_cls[level][1], atol=1e-4)
    # the head's convs are plain again outside a forward
    assert all(c.cali_vectors is None for c in head.dense_cls_convs().values())


def test_a_permutation_of_the_classes_permutes_the_scores(answering):
    """Relabel the classes: permute the CaliFormer's class nodes, the
    classification convs' rows and the prior; every level's scores are
    the original ones with their channels permuted."""
    model = answering
    feats, _ = features(model)
    head = model.bbox_head
    perm = torch.randperm(80, generator=torch.Generator().manual_seed(2))
    permuted = copy.deepcopy(head)
    with torch.no_grad():
        permuted.califormer.nodes.copy_(head.califormer.nodes[perm])
        for conv, orig in zip(permuted.dense_cls_convs().values(),
                              head.dense_cls_convs().values()):
            conv.weight.copy_(orig.weight[perm])
            conv.bias.copy_(orig.bias[perm])
        prior = torch.as_tensor(random_prior(5), dtype=torch.float32)
        cali = head.get_cali_vectors(prior)
        cali_perm = permuted.get_cali_vectors(prior[perm][:, perm])
        torch.testing.assert_close(cali_perm, cali[perm], atol=1e-5, rtol=1e-5)
        cls, _ = head(feats, cali)
        cls_perm, _ = permuted(feats, cali_perm)
    for a, b in zip(cls_perm, cls):
        torch.testing.assert_close(a, b[:, perm], atol=1e-5, rtol=1e-5)


def test_matched_class_loma_by_hand(model):
    head = model.bbox_head
    k = 80
    scores = torch.randn(1, 3, k, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[5, k, 7]])  # two positives, one background
    prior = prior_of([5, 7])
    sample = prior_of([5, 9])
    w = loma_class_weights(prior, sample[None])[0]
    expected = 20.0 * (scores[0, 0, 5] * w[5] + scores[0, 2, 7] * w[7]) / k / 2
    got = head.matched_class_loma(scores, labels, prior, sample[None])
    torch.testing.assert_close(got, expected)
    # class 7 is not in the image (flat column of E_x): no push
    assert w[7] == 0 and w[5] < 0


def test_loma_acts_on_the_assigned_class_of_positive_locations(
        answering, monkeypatch):
    model = answering
    model.train()
    seen = []
    original = RTMDetSepBNHead.get_targets

    def spy(self, cls_scores, *args, **kwargs):
        targets = original(self, cls_scores, *args, **kwargs)
        seen.append((cls_scores, torch.cat(targets[1], dim=1)))
        return targets

    monkeypatch.setattr(RTMDetSepBNHead, 'get_targets', spy)
    data = model.data_preprocessor(demo_batch(LABELS, size=64), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    (scores, labels), = seen
    pos = labels < 80
    assert pos.any() and set(labels[pos].tolist()) <= {1, 2, 3}
    priors = torch.stack([ds.prior for ds in data['data_samples']]).float()
    sample = torch.stack(
        [torch.as_tensor(ds.sample_prior) for ds in data['data_samples']])
    w = loma_class_weights(priors, sample.float())
    b, n = pos.nonzero(as_tuple=True)
    terms = scores[b, n, labels[b, n]] * w[b, labels[b, n]]
    expected = 20.0 * terms.sum() / 80 / pos.sum()
    torch.testing.assert_close(losses['loss_loma'], expected)


def test_trains_the_califormer(model):
    check_califormer_trains(model, LABELS,
                            ('loss_cls', 'loss_bbox', 'loss_loma'))


def test_a_bad_prior_is_refused_and_the_last_one_kept(model):
    check_bad_priors_refused(model)


def test_inference_detector_takes_a_prior_per_call_and_per_image(answering):
    check_inference_priors(answering)


def test_the_decoder_caches_refuse_it_by_name(model):
    """The evaluation tools rescore a DETR's cached decoder outputs: a
    one-stage detector gets an error that says so, not an AttributeError
    deep inside."""
    from mmcalidet.decoder_cache import cache_hidden_states
    with pytest.raises(TypeError, match='CaliRTMDet has no DETR decoder'):
        cache_hidden_states(model, [demo_batch(LABELS)])
