# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFasterRCNN, CaliDet on a two-stage detector: builds from its config
(a plain Faster R-CNN checkpoint loads), starts as Faster R-CNN, calibrates
the box head's class logits with V' (shared, or each RoI its image's), is
equivariant to a permutation of the classes, puts LoMa on the target class
of the sampled positive RoIs, trains and refuses a bad prior."""
import copy

import pytest
import torch
from mmdet.models.roi_heads import StandardRoIHead
from mmdet.models.roi_heads.bbox_heads import BBoxHead, Shared2FCBBoxHead
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox2roi

from mmcalidet.apis import is_calibratable
from mmcalidet.models.detectors import CalibratableTwoStageMixin
from mmcalidet.models.layers import CalibratedLinear
from mmcalidet.models.losses import loma_class_weights
from mmcalidet.models.roi_heads import (CalibratedBBoxClsMixin,
                                        CaliStandardRoIHead, pad_by_image)
from mmcalidet.priors import label_lists_prior
from testing import (build_detector, check_bad_priors_refused,
                     check_califormer_trains, check_inference_priors,
                     demo_batch, get_config, random_prior)

CONFIG = 'calidet/calidet_faster-rcnn_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ))
K = 80


@pytest.fixture(scope='module')
def model():
    model = build_detector(CONFIG, seed=0)
    # random weights score every class near 1 / 81: keep every detection
    # (of fewer proposals, for speed)
    model.roi_head.test_cfg.score_thr = 0.0
    model.rpn_head.test_cfg.max_per_img = 100
    return model


@pytest.fixture
def answering(model):
    """The model with a CaliFormer whose V' is not 0, restored after."""
    head = model.roi_head.bbox_head
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.califormer.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None


def roi_features(model, labels=LABELS, size=64):
    """The levels' features, RoIs of both images (image 1's first) and
    their RoI features."""
    model.eval()
    data = model.data_preprocessor(demo_batch(labels, size=size), False)
    gen = torch.Generator().manual_seed(3)
    boxes = []
    for n in (5, 3):
        xy = torch.rand(n, 2, generator=gen) * size * 0.5
        boxes.append(torch.cat([xy, xy + size * 0.4], dim=1))
    rois = bbox2roi(boxes[::-1]).flip(0)  # not grouped by image
    with torch.no_grad():
        x = model.extract_feat(data['inputs'])
        extractor = model.roi_head.bbox_roi_extractor
        feats = extractor(x[:extractor.num_inputs], rois)
    return x, rois, feats


def cls_features(head, roi_feats):
    """The input of ``fc_cls``, by hand (Shared2FC: two shared fcs)."""
    x = roi_feats.flatten(1)
    for fc in head.shared_fcs:
        x = head.relu(fc(x))
    return x


def prior_of(labels, k=K):
    return torch.as_tensor(
        label_lists_prior([list(labels)], k)[0], dtype=torch.float32)


def test_builds_from_its_config_through_the_registries(model):
    cfg = get_config(CONFIG)
    assert MODELS.get(cfg.model.type) is type(model)
    assert isinstance(model, CalibratableTwoStageMixin)
    assert isinstance(model.roi_head, CaliStandardRoIHead)
    head = model.roi_head.bbox_head
    assert model.calibrated_head is head and is_calibratable(model)
    assert isinstance(head, CalibratedBBoxClsMixin)
    assert isinstance(head, Shared2FCBBoxHead)
    assert isinstance(head.fc_cls, CalibratedLinear)
    assert head.fc_cls.out_features == K + 1  # softmax: + background
    # V' has the width of the features fc_cls reads
    assert head.get_cali_vectors(head.flat_priors(torch.zeros(1))).shape == \
        (K, head.fc_cls.in_features)


def test_a_plain_faster_rcnn_checkpoint_loads(model):
    cfg = get_config(CONFIG).model
    cfg.type = 'FasterRCNN'
    cfg.pop('prior')
    cfg.data_preprocessor.pop('batch_augments')
    cfg.roi_head.type = 'StandardRoIHead'
    for key in ('califormer', 'rho', 'loss_loma'):
        cfg.roi_head.bbox_head.pop(key)
    cfg.roi_head.bbox_head.type = 'Shared2FCBBoxHead'
    plain = MODELS.build(cfg)
    state = copy.deepcopy(model.state_dict())
    try:
        missing, unexpected = model.load_state_dict(
            plain.state_dict(), strict=False)
        assert not unexpected
        assert all(
            k == 'prior' or k.startswith('roi_head.bbox_head.califormer.')
            for k in missing), missing
        torch.testing.assert_close(model.roi_head.bbox_head.fc_cls.weight,
                                   plain.roi_head.bbox_head.fc_cls.weight)
    finally:
        model.load_state_dict(state)


def test_needs_a_calibrated_box_head():
    cfg = get_config(CONFIG)
    head = cfg.model.roi_head.bbox_head
    for key in ('califormer', 'rho', 'loss_loma'):
        head.pop(key)
    head.type = 'Shared2FCBBoxHead'
    with pytest.raises(TypeError, match='calibrated bbox_head'):
        MODELS.build(cfg.model)


def test_starts_as_faster_rcnn_whatever_the_prior(model):
    x, rois, feats = roi_features(model)
    head = model.roi_head.bbox_head
    with torch.no_grad():
        plain_cls, plain_box = Shared2FCBBoxHead.forward(head, feats)
        for prior in (prior_of([1, 2]), torch.as_tensor(random_prior(3))):
            model.set_prior(prior.numpy())
            cali = model.deployment_cali_vectors()
            cls, box = head(feats, cali)
            torch.testing.assert_close(cls, plain_cls)
            torch.testing.assert_close(box, plain_box)
            with head.calibrated(cali):
                out = model.roi_head._bbox_forward(x, rois)
            torch.testing.assert_close(out['cls_score'], plain_cls)
    model.set_prior(None)


def test_class_logits_are_plain_plus_rho_x_v_prime(answering):
    model = answering
    x, rois, feats = roi_features(model)
    head = model.roi_head.bbox_head
    with torch.no_grad():
        plain_cls, plain_box = Shared2FCBBoxHead.forward(head, feats)
        h = cls_features(head, feats)
        cali = head.get_cali_vectors(prior_of([1, 2]))
        cls, box = head(feats, cali)
    expected = plain_cls.clone()
    expected[:, :K] += head.rho * h @ cali.t()
    torch.testing.assert_close(cls, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(cls[:, :K], plain_cls[:, :K], atol=1e-4)
    # the background logit and the boxes stay Faster R-CNN's
    torch.testing.assert_close(cls[:, K], plain_cls[:, K])
    torch.testing.assert_close(box, plain_box)
    assert head.fc_cls.cali_vectors is None  # plain outside a forward


def test_each_roi_reads_its_image_v_prime(answering):
    """Per-image V' (B x K x d): through the RoI head, every RoI gets the
    logits that its image's V' gives it."""
    model = answering
    x, rois, feats = roi_features(model)
    head = model.roi_head.bbox_head
    priors = torch.stack([prior_of([1, 2]), prior_of([3])])
    with torch.no_grad():
        cali = head.get_cali_vectors(priors)
        with head.calibrated(cali):
            per_image = model.roi_head._bbox_forward(x, rois)['cls_score']
        with pytest.raises(ValueError, match='image index'):
            head(feats, cali)  # per-image V' without the RoIs' images
        for b in range(2):
            shared, _ = head(feats, cali[b])
            rows = rois[:, 0] == b
            torch.testing.assert_close(
                per_image[rows], shared[rows], atol=1e-5, rtol=1e-5)
            assert not torch.allclose(
                per_image[~rows], shared[~rows], atol=1e-4)


def test_a_permutation_of_the_classes_permutes_the_scores(answering):
    """Relabel the classes: permute the CaliFormer's class nodes, fc_cls's
    class rows and the prior; the class logits are the original ones with
    their columns permuted, the background logit unchanged."""
    model = answering
    _, _, feats = roi_features(model)
    head = model.roi_head.bbox_head
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(2))
    rows = torch.cat([perm, torch.tensor([K])])  # background stays last
    permuted = copy.deepcopy(head)
    with torch.no_grad():
        permuted.califormer.nodes.copy_(head.califormer.nodes[perm])
        permuted.fc_cls.weight.copy_(head.fc_cls.weight[rows])
        permuted.fc_cls.bias.copy_(head.fc_cls.bias[rows])
        prior = torch.as_tensor(random_prior(5), dtype=torch.float32)
        cali = head.get_cali_vectors(prior)
        cali_perm = permuted.get_cali_vectors(prior[perm][:, perm])
        torch.testing.assert_close(cali_perm, cali[perm], atol=1e-5, rtol=1e-5)
        cls, _ = head(feats, cali)
        cls_perm, _ = permuted(feats, cali_perm)
    torch.testing.assert_close(cls_perm, cls[:, rows], atol=1e-5, rtol=1e-5)


def test_rois_are_grouped_by_image_with_padding():
    values = torch.arange(5.)[:, None]
    images = torch.tensor([1, 0, 1, 1, 0])
    padded = pad_by_image(values, images, 3, -1.)
    assert padded[..., 0].tolist() == [[1, 4, -1], [0, 2, 3], [-1, -1, -1]]


def test_loma_acts_on_the_target_class_of_sampled_positive_rois(
        answering, monkeypatch):
    model = answering
    model.train()
    targets, forwards = [], []
    get_targets, bbox_forward = BBoxHead.get_targets, \
        StandardRoIHead._bbox_forward

    def spy_targets(self, *args, **kwargs):
        out = get_targets(self, *args, **kwargs)
        targets.append(out[0])
        return out

    def spy_forward(self, x, rois):
        out = bbox_forward(self, x, rois)
        forwards.append((rois, out['cls_score']))
        return out

    monkeypatch.setattr(BBoxHead, 'get_targets', spy_targets)
    monkeypatch.setattr(StandardRoIHead, '_bbox_forward', spy_forward)
    data = model.data_preprocessor(demo_batch(LABELS, size=64), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    (labels, ), ((rois, scores), ) = targets, forwards
    pos = labels < K
    assert pos.any() and set(labels[pos].tolist()) <= {1, 2, 3}
    priors = torch.stack([ds.prior for ds in data['data_samples']]).float()
    sample = torch.stack(
        [torch.as_tensor(ds.sample_prior) for ds in data['data_samples']])
    w = loma_class_weights(priors, sample.float())
    n = pos.nonzero(as_tuple=True)[0]
    terms = scores[n, labels[n]] * w[rois[n, 0].long(), labels[n]]
    expected = 20.0 * terms.sum() / K / pos.sum()
    torch.testing.assert_close(losses['loss_loma'], expected)


def test_trains_the_califormer(model):
    check_califormer_trains(model, LABELS,
                            ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls',
                             'loss_bbox', 'loss_loma'))


def test_a_bad_prior_is_refused_and_the_last_one_kept(model):
    check_bad_priors_refused(model)


def test_inference_detector_takes_a_prior_per_call_and_per_image(answering):
    check_inference_priors(answering)
