# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFCOS, the new one-stage family of the head-kind adapters: builds
from its config, is of the dense kind and the FCOS family, starts as FCOS,
calibrates its one 3 x 3 classification conv (shared by five levels) at
the kernel's centre with one V' (shared or per image), folds a prior into
that conv, puts LoMa on the assigned class of the positive locations,
trains and refuses a bad prior."""
import copy

import pytest
import torch
from mmdet.models.dense_heads import FCOSHead
from mmdet.registry import MODELS

from mmcalidet.deploy import fold_prior
from mmcalidet.models.dense_heads import CalibratedDenseClsMixin, CaliFCOSHead
from mmcalidet.models.detectors import CalibratableSingleStageMixin, CaliFCOS
from mmcalidet.models.head_kinds import DENSE, head_kind_of
from mmcalidet.models.layers import CalibratedConv2d
from mmcalidet.models.losses import loma_class_weights
from mmcalidet.priors import label_lists_prior
from testing import (build_detector, check_bad_priors_refused,
                     check_califormer_trains, check_inference_priors,
                     demo_batch, get_config, random_prior)

CONFIG = 'calidet/calidet_fcos_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ))


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


@pytest.fixture
def answering(model):
    """The model with a CaliFormer whose V' is not 0, classification
    towers whose features are not near 0 and scores above the test
    threshold, restored after."""
    head = model.bbox_head
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*head.califormer.parameters(), *head.cls_convs.parameters()]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        head.conv_cls.bias.fill_(0.0)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None
    model.set_prior(None)


def features(model, labels=LABELS, size=64):
    model.eval()
    data = model.data_preprocessor(demo_batch(labels, size=size), False)
    with torch.no_grad():
        return model.extract_feat(data['inputs']), data['data_samples']


def prior_of(labels, k=80):
    return torch.as_tensor(
        label_lists_prior([list(labels)], k)[0], dtype=torch.float32)


def test_builds_from_its_config_through_the_registries(model):
    cfg = get_config(CONFIG)
    assert MODELS.get(cfg.model.type) is type(model) is CaliFCOS
    assert isinstance(model, CalibratableSingleStageMixin)
    head = model.bbox_head
    assert isinstance(head, CaliFCOSHead)
    assert isinstance(head, CalibratedDenseClsMixin)
    assert isinstance(head, FCOSHead)
    # one adapter for the kind, one family for FCOS's targets and loss
    assert head_kind_of(model) is DENSE
    assert DENSE.family(head).name == 'fcos'
    assert set(head.dense_cls_convs()) == {'conv_cls'}
    conv = head.conv_cls
    assert isinstance(conv, CalibratedConv2d) and conv.kernel_size == (3, 3)
    assert DENSE.level_convs(head) == [conv] * 5
    # a cached location is the conv's input over its kernel
    assert DENSE.feature_width(head) == head.feat_channels * 9
    assert head.get_cali_vectors(head.flat_priors(torch.zeros(1))).shape == \
        (80, head.feat_channels)
    # the parameters keep FCOS's names: a plain FCOS checkpoint loads
    assert 'bbox_head.conv_cls.weight' in model.state_dict()
    plain = build_detector('calidet/fcos_tiny_coco-mini.py', seed=0)
    assert set(plain.state_dict()) == {
        k
        for k in model.state_dict() if 'califormer' not in k and k != 'prior'
    }


def test_starts_as_fcos_whatever_the_prior(model):
    feats, _ = features(model)
    head = model.bbox_head
    with torch.no_grad():
        plain = FCOSHead.forward(head, feats)
        for prior in (prior_of([1, 2]), torch.as_tensor(random_prior(3))):
            model.set_prior(prior.numpy())
            outs = head(feats, model.deployment_cali_vectors())
            for a, b in zip(sum(outs, []), sum(plain, [])):
                torch.testing.assert_close(a, b)
    model.set_prior(None)


def test_v_prime_moves_the_scores_at_every_level(answering):
    """Each level's scores are FCOS's plus rho V'^T x, x the conv's
    input at the location (the kernel's centre); the centerness and the
    boxes do not move. One shared V' (folded into the kernel) gives image b
    what the per-image path gives it under the same prior."""
    model = answering
    feats, _ = features(model)
    head = model.bbox_head
    priors = torch.stack([prior_of([1, 2]), prior_of([3])])
    with torch.no_grad():
        with DENSE.recording_calls(head) as calls:
            plain = FCOSHead.forward(head, feats)
        inputs = [x for x, _ in calls]
        cali = head.get_cali_vectors(priors)
        per_image = head(feats, cali)
        for level, x in enumerate(inputs):
            expected = plain[0][level] + head.rho * torch.einsum(
                'bdhw,bkd->bkhw', x, cali)
            torch.testing.assert_close(
                per_image[0][level], expected, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(per_image[0][level], plain[0][level])
            for out in (1, 2):
                torch.testing.assert_close(per_image[out][level],
                                           plain[out][level])
        shared = head(feats, cali[0])
        for level in range(len(feats)):
            torch.testing.assert_close(
                shared[0][level][0],
                per_image[0][level][0],
                atol=1e-5,
                rtol=1e-5)
    assert head.conv_cls.cali_vectors is None


def test_a_folded_prior_is_the_calibrated_model(answering):
    model = answering
    prior = random_prior(4)
    model.set_prior(prior)
    feats, _ = features(model)
    folded = fold_prior(model, prior)
    assert folded.bbox_head.rho == 0.0
    with torch.no_grad():
        want = model.bbox_head(feats, model.deployment_cali_vectors())
        got = folded.bbox_head(feats)
    for a, b in zip(sum(got, []), sum(want, [])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_loma_acts_on_the_assigned_class_of_positive_locations(
        answering, monkeypatch):
    model = answering
    model.train()
    seen = []
    original = FCOSHead.loss_by_feat

    def spy(self, cls_scores, bbox_preds, centernesses, gt, *args):
        points = self.prior_generator.grid_priors(
            [s.shape[-2:] for s in cls_scores],
            dtype=cls_scores[0].dtype,
            device=cls_scores[0].device)
        labels = self.get_targets(points, gt)[0]
        seen.append((cls_scores, labels))
        return original(self, cls_scores, bbox_preds, centernesses, gt, *args)

    monkeypatch.setattr(FCOSHead, 'loss_by_feat', spy)
    data = model.data_preprocessor(demo_batch(LABELS, size=64), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    (cls_scores, labels), = seen
    b = len(cls_scores[0])
    # per image, the levels one after the other
    scores = torch.cat([s.flatten(2).transpose(1, 2) for s in cls_scores], 1)
    labels = torch.cat([lvl.reshape(b, -1) for lvl in labels], 1)
    pos = labels < 80
    assert pos.any() and set(labels[pos].tolist()) <= {1, 2, 3}
    priors = torch.stack([ds.prior for ds in data['data_samples']]).float()
    sample = torch.stack(
        [torch.as_tensor(ds.sample_prior) for ds in data['data_samples']])
    w = loma_class_weights(priors, sample.float())
    i, n = pos.nonzero(as_tuple=True)
    terms = scores[i, n, labels[i, n]] * w[i, labels[i, n]]
    expected = 20.0 * terms.sum() / 80 / pos.sum()
    torch.testing.assert_close(losses['loss_loma'], expected)
    assert {'loss_cls', 'loss_bbox', 'loss_centerness'} <= set(losses)


def test_trains_the_califormer(model):
    check_califormer_trains(
        model, LABELS,
        ('loss_cls', 'loss_bbox', 'loss_centerness', 'loss_loma'))


def test_a_bad_prior_is_refused_and_the_last_one_kept(model):
    check_bad_priors_refused(model)


def test_inference_detector_takes_a_prior_per_call_and_per_image(answering):
    check_inference_priors(answering)
