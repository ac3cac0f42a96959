# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDeformableDETR / CaliDeformableDETRHead: the tests of CaliDINO on
the second baseline (single-scale, two-stage, and the COCO configs)."""
import copy

import numpy as np
import pytest
import torch
from mmdet.models.dense_heads import DeformableDETRHead
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import load_checkpoint, save_checkpoint

from mmcalidet.models.dense_heads import CalibratedClsMixin
from mmcalidet.priors import flat_prior, sample_prior
from testing import build_detector, demo_batch, eval_inputs, get_config
from testing import random_prior as make_random_prior
from testing import train_steps

K = 80
TINY = 'calidet/calidet_deformable-detr_tiny_coco-mini.py'
register_all_modules()


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    # the tiny model is far faster on one thread when cores are shared
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name=TINY, seed=0, **model):
    return build_detector(name, seed, **model)


@pytest.fixture(scope='module')
def model():
    return build()


def random_prior(seed):
    return make_random_prior(seed, K)


def test_head_is_the_shared_calibration_on_deformable_detr(model):
    head = model.bbox_head
    assert isinstance(head, CalibratedClsMixin)
    assert isinstance(head, DeformableDETRHead)
    # the calibration is the mixin's, not a copy in this head
    for name in ('forward', 'predict', 'calibrate_cls_scores',
                 'get_cali_vectors', 'loss_loma_by_feat'):
        assert name not in vars(type(head)), name
    assert sum(1 for m in head.modules()
               if type(m).__name__ == 'CaliFormer') == 1
    # single scale: one feature level in the detector and its attentions
    assert model.num_feature_levels == 1
    assert model.encoder.layers[0].self_attn.num_levels == 1


def test_calibrated_logits_equal_shifted_weights(model):
    head = model.bbox_head
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 2, 5, 256, generator=gen)
    refs = [torch.rand(2, 5, 2, generator=gen) for _ in range(3)]
    cali = head.get_cali_vectors(torch.tensor(random_prior(1)).float())
    with torch.no_grad():
        cls, boxes = head(hidden, refs, cali)
        plain_cls, plain_boxes = DeformableDETRHead.forward(head, hidden, refs)
    for layer in range(2):
        fc = head.cls_branches[layer]
        expected = hidden[layer] @ (fc.weight + head.rho * cali).t() + fc.bias
        torch.testing.assert_close(cls[layer], expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(boxes, plain_boxes)
    assert not torch.allclose(cls, plain_cls, atol=1e-3)


def test_scores_follow_the_prior_boxes_and_hidden_states_do_not(model):
    model.eval()
    inputs, samples = eval_inputs(model)
    outs, hidden = [], []
    with torch.no_grad():
        feats = model.extract_feat(inputs)
        for seed in (1, 2):
            model.set_prior(random_prior(seed))
            head_inputs = model.forward_transformer(feats, samples)
            hidden.append(head_inputs['hidden_states'])
            outs.append(model._forward(inputs, samples))
    assert torch.equal(hidden[0], hidden[1])
    (cls1, box1), (cls2, box2) = outs
    assert cls1.shape == (2, 2, 30, K)  # decoder layers, batch, queries
    assert torch.equal(box1, box2)
    assert not torch.allclose(cls1, cls2, atol=1e-3)


def test_predict_uses_the_prior_and_a_sample_prior_overrides_it(model):
    model.eval()
    inputs, samples = eval_inputs(model)
    with torch.no_grad():
        model.set_prior(sample_prior(K, [1, 2]))
        first = model.predict(inputs, copy.deepcopy(samples))
        model.set_prior(random_prior(3))
        second = model.predict(inputs, copy.deepcopy(samples))
        overridden = copy.deepcopy(samples)
        for s in overridden:
            s.prior = torch.tensor(sample_prior(K, [1, 2])).float()
        third = model.predict(inputs, overridden)
    assert len(first[0].pred_instances) == 30
    assert not torch.allclose(first[0].pred_instances.scores,
                              second[0].pred_instances.scores)
    torch.testing.assert_close(first[0].pred_instances.scores,
                               third[0].pred_instances.scores)
    assert torch.equal(first[1].pred_instances.bboxes,
                       third[1].pred_instances.bboxes)


@pytest.mark.parametrize('labels', [[[]], [[2]]])
def test_loss_without_and_with_gt(labels):
    model = build()
    model.train()
    data = model.data_preprocessor(demo_batch(labels, size=64), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    # one LoMa per decoder layer, named as mmdet names the DETR losses
    assert {'loss_loma', 'd0.loss_loma', 'loss_cls', 'd0.loss_cls'} \
        <= set(losses)
    assert not any(k.startswith('enc_') for k in losses)  # no proposals
    for key, loss in losses.items():
        value = loss.item()
        assert np.isfinite(value), key
        if not labels[0] and ('bbox' in key or 'iou' in key or 'loma' in key):
            # no GT: no box loss, and E_x = E0 gives no LoMa
            assert value == 0, key
        elif 'loma' not in key:
            assert value > 0, key
    if labels[0]:
        assert losses['loss_loma'].item() != 0
        assert losses['d0.loss_loma'].item() != 0
        assert losses['loss_loma'].item() != losses['d0.loss_loma'].item()


def test_loma_on_matched_classes(model):
    """The shared LoMa option works on Deformable DETR: the matched-class
    LoMa of each layer uses the assignment of that layer's own losses."""
    model.train()
    data = model.data_preprocessor(demo_batch([[1, 2], [3]], size=64), False)
    samples = data['data_samples']
    head_inputs = model.forward_transformer(
        model.extract_feat(data['inputs']), samples)
    head = model.bbox_head
    lomas = {}
    try:
        for queries in ('all', 'matched_class'):
            head.loma_queries = queries
            with torch.no_grad():
                lomas[queries] = head.loss(
                    **head_inputs, batch_data_samples=samples)
    finally:
        head.loma_queries = 'all'
    assert {'loss_loma', 'd0.loss_loma'} <= set(lomas['matched_class'])
    for key in ('loss_loma', 'd0.loss_loma'):
        assert lomas['matched_class'][key].item() != lomas['all'][key].item()
        assert np.isfinite(lomas['matched_class'][key].item())
    for key, value in lomas['all'].items():
        if 'loma' not in key:  # the DETR losses do not change
            assert torch.equal(value, lomas['matched_class'][key]), key


def test_loss_uses_the_given_priors_and_reaches_the_califormer(model):
    model.train()
    data = model.data_preprocessor(demo_batch([[1, 2]], size=64), False)
    head_inputs = model.forward_transformer(
        model.extract_feat(data['inputs']), data['data_samples'])
    head_inputs.pop('cali_vectors')
    priors = head_inputs.pop('priors')
    assert priors.shape == (1, K, K)
    head = model.bbox_head
    good = torch.tensor(sample_prior(K, [1, 2])).float()[None]
    wrong = torch.tensor(sample_prior(K, [5, 6])).float()[None]
    lomas = []
    for prior in (good, wrong):
        losses = head.loss(
            **head_inputs,
            batch_data_samples=data['data_samples'],
            cali_vectors=head.get_cali_vectors(prior),
            priors=prior)
        lomas.append(losses['loss_loma'].item())
    assert lomas[0] != lomas[1]
    head.zero_grad()
    sum(losses.values()).backward()
    assert head.califormer.nodes.grad.abs().sum() > 0
    with pytest.raises(ValueError, match='priors'):
        head.loss(
            **head_inputs,
            batch_data_samples=data['data_samples'],
            cali_vectors=head.get_cali_vectors(good))
    # without priors: E0, and LoMa vanishes
    losses = head.loss(**head_inputs, batch_data_samples=data['data_samples'])
    assert losses['loss_loma'].item() == 0


def test_two_stage_proposals_stay_uncalibrated():
    # a 64 px image has 2 x 2 single-scale tokens to select queries from
    model = build(as_two_stage=True, with_box_refine=True, num_queries=4)
    head = model.bbox_head
    # decoder layers + the encoder's proposal branch
    assert len(head.cls_branches) == 3
    model.train()
    batch = demo_batch([[1, 2]], size=64)
    enc, losses = [], None
    for seed in (1, 2):
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        data['data_samples'][0].prior = torch.tensor(
            random_prior(seed), dtype=torch.float32)
        torch.manual_seed(0)  # same dropout
        feats = model.extract_feat(data['inputs'])
        head_inputs = model.forward_transformer(feats, data['data_samples'])
        enc.append(head_inputs['enc_outputs_class'])
        if losses is None:
            losses = head.loss(
                **head_inputs, batch_data_samples=data['data_samples'])
    assert torch.equal(enc[0], enc[1])
    assert {'enc_loss_cls', 'loss_loma', 'd0.loss_loma'} <= set(losses)
    model.eval()
    inputs, samples = eval_inputs(model)
    with torch.no_grad():
        cls1, box1 = model._forward(inputs, samples)
        model.set_prior(random_prior(4))
        cls2, box2 = model._forward(inputs, samples)
    assert torch.equal(box1, box2)
    assert not torch.allclose(cls1, cls2, atol=1e-3)


@pytest.mark.slow
def test_training_reduces_the_loss():
    history = train_steps(
        build(), demo_batch([[1, 2], [3, 3]], size=64, seed=1), steps=8)
    assert np.mean(history[-2:]) < 0.7 * np.mean(history[:2]), history


def test_checkpoint_reloads_and_predicts_identically(tmp_path):
    model = build(seed=1)
    model.set_prior(random_prior(11))  # carried by the checkpoint
    with torch.no_grad():
        model.bbox_head.califormer.nodes.normal_()
    path = str(tmp_path / 'tiny.pth')
    save_checkpoint(
        dict(state_dict=model.state_dict(), meta=dict(seed=np.int64(1))), path)
    reloaded = build(seed=2, prior=None)
    assert np.array_equal(reloaded.get_prior(), flat_prior(K))
    load_checkpoint(reloaded, path, map_location='cpu', strict=True)
    np.testing.assert_array_equal(reloaded.get_prior(), model.get_prior())
    model.eval()
    reloaded.eval()
    inputs, samples = eval_inputs(model)
    with torch.no_grad():
        a = model.predict(inputs, copy.deepcopy(samples))
        b = reloaded.predict(inputs, copy.deepcopy(samples))
    for x, y in zip(a, b):
        assert torch.equal(x.pred_instances.scores, y.pred_instances.scores)
        assert torch.equal(x.pred_instances.bboxes, y.pred_instances.bboxes)
        assert torch.equal(x.pred_instances.labels, y.pred_instances.labels)


@pytest.mark.parametrize('name, levels', [
    ('calidet/calidet_deformable-detr-ss_r50_8xb2-6e_coco.py', 1),
    ('calidet/calidet_deformable-detr_r50_8xb2-6e_coco.py', 4),
])
@pytest.mark.slow  # builds and runs the ResNet-50 detector
def test_coco_configs(name, levels):
    cfg = get_config(name)
    # inherits mmdet's Deformable DETR and changes only what CaliDet needs
    assert cfg.model.type == 'CaliDeformableDETR'
    assert cfg.model.bbox_head.type == 'CaliDeformableDETRHead'
    assert cfg.model.bbox_head.loss_cls.loss_weight == 2.0  # mmdet's
    assert cfg.model.num_queries == 300 and cfg.model.encoder.num_layers == 6
    assert cfg.model.bbox_head.califormer.num_layers == 3
    assert cfg.model.num_feature_levels == levels
    sampler, = cfg.model.data_preprocessor.batch_augments
    assert sampler.type == 'EdgeSampler' and sampler.group_size == 4
    assert sampler.mode_probs['group'] > 0  # the supplementary's E_b(4)
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    assert cfg.train_cfg.max_epochs == 6
    # the R50 model builds and runs with the shipped COCO prior
    cfg.model.num_queries = 10
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()  # mmdet's level_embed starts uninitialised
    np.testing.assert_allclose(model.get_prior()[0, 0], 1.0)
    assert model.encoder.layers[0].self_attn.num_levels == levels
    model.eval()
    inputs, samples = eval_inputs(model, labels=((1, ), ), size=64)
    with torch.no_grad():
        result = model.predict(inputs, samples)
    assert len(result[0].pred_instances) == cfg.model.test_cfg.max_per_img


def test_single_scale_baseline_config():
    cfg = get_config('calidet/deformable-detr-ss_r50_16xb2-50e_coco.py')
    assert cfg.model.type == 'DeformableDETR'
    assert cfg.model.num_feature_levels == 1
    assert cfg.model.neck.in_channels == [2048]
    ss = get_config('calidet/calidet_deformable-detr-ss_r50_8xb2-6e_coco.py')
    assert ss.load_from.startswith(
        'work_dirs/deformable-detr-ss_r50_16xb2-50e_coco/')
