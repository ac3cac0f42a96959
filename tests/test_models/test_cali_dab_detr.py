# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDABDETR: the worked example of docs/user_guides/new_baseline.md (a
head with one ``fc_cls`` shared by the decoder layers) builds from its
config, starts as DAB-DETR, follows the prior and trains, on images and on
cached decoder outputs."""
import pytest
import torch
from mmdet.models.dense_heads import DABDETRHead, DETRHead
from mmdet.registry import MODELS

from mmcalidet.models.dense_heads import CalibratedClsMixin
from mmcalidet.models.detectors import (CalibratableDetectorMixin,
                                        cached_head_losses)
from mmcalidet.priors import label_lists_prior
from testing import (build_detector, check_califormer_trains, demo_batch,
                     get_config)

CONFIG = 'calidet/calidet_dab-detr_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ))


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


def decoder_outputs(model, labels=LABELS):
    """The decoder outputs of a demo batch in eval mode, and its samples."""
    model.eval()
    data = model.data_preprocessor(demo_batch(labels, size=64), False)
    with torch.no_grad():
        head_inputs = model.forward_transformer(
            model.extract_feat(data['inputs']), data['data_samples'])
    return head_inputs, data['data_samples']


def test_builds_from_its_config_through_the_registries(model):
    cfg = get_config(CONFIG)
    assert MODELS.get(cfg.model.type) is type(model)
    assert isinstance(model, CalibratableDetectorMixin)
    assert isinstance(model.bbox_head, CalibratedClsMixin)
    assert isinstance(model.bbox_head, DABDETRHead)
    # the shared classifier is every decoder layer's
    head = model.bbox_head
    assert head.decoder_cls_branch(0) is head.decoder_cls_branch(-1) \
        is head.fc_cls


def test_starts_as_dab_detr_and_only_scores_follow_the_prior(model):
    head_inputs, _ = decoder_outputs(model)
    hidden, refs = head_inputs['hidden_states'], head_inputs['references']
    head = model.bbox_head
    with torch.no_grad():
        plain_cls, plain_box = DABDETRHead.forward(head, hidden, refs)
        # zero_init_output: V' = 0, the baseline's logits whatever the prior
        cls, box = head(hidden, refs, head_inputs['cali_vectors'])
        torch.testing.assert_close(cls, plain_cls)
        torch.testing.assert_close(box, plain_box)
        # a CaliFormer that answers: another prior moves the logits by
        # rho V'^T h, and never the boxes
        state = {k: v.clone() for k, v in head.califormer.state_dict().items()}
        try:
            for p in head.califormer.parameters():
                p.add_(torch.randn_like(p) * 0.1)
            prior = torch.as_tensor(
                label_lists_prior([[1, 2]], head.num_classes)[0],
                dtype=torch.float32)
            cali = head.get_cali_vectors(prior)
            cls2, box2 = head(hidden, refs, cali)
            expected = plain_cls + head.rho * torch.matmul(hidden, cali.t())
        finally:
            head.califormer.load_state_dict(state)
    torch.testing.assert_close(cls2, expected)
    torch.testing.assert_close(box2, plain_box)
    assert not torch.allclose(cls2, plain_cls)


def test_trains_with_loma_on_every_decoder_layer(model):
    check_califormer_trains(
        model, LABELS,
        ('loss_loma', 'd0.loss_loma', 'loss_cls', 'd0.loss_cls'))


def test_cached_decoder_outputs_give_the_losses_of_the_images(model):
    """The calibrator trains on cached decoder outputs through the shared
    ``fc_cls``: the same logits and DETR losses as on images, and a
    ``CachedCalibration`` model of it only updates the CaliFormer."""
    head_inputs, samples = decoder_outputs(model)
    hidden, refs = head_inputs['hidden_states'], head_inputs['references']
    head = model.bbox_head
    priors = torch.as_tensor(
        label_lists_prior([list(x) for x in LABELS], 80),
        dtype=torch.float32)
    with torch.no_grad():
        cali = head.get_cali_vectors(priors)
        cls, box = head(hidden, refs, cali)
        expected = DETRHead.loss_by_feat(head, cls, box,
                                         [ds.gt_instances for ds in samples],
                                         [ds.metainfo for ds in samples])
        got = cached_head_losses(head, hidden, box, samples, cali, priors)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)
    cfg = get_config(CONFIG)
    cached = MODELS.build(
        dict(cfg.model, type='CachedCalibration', detector=cfg.model.type))
    assert set(cached.calibrator_modules()) == {'bbox_head.califormer'}
    cached.cache_train_cls_branches = True
    assert set(cached.calibrator_modules()) == {
        'bbox_head.califormer', 'bbox_head.fc_cls'
    }
