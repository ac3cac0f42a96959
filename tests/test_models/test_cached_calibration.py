# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on cached decoder outputs: the same logits and
losses as the head on images, gradients only where they belong."""
import copy

import pytest
import torch
from mmdet.models.dense_heads import DeformableDETRHead

from mmcalidet.models.data_preprocessors import is_cached_batch
from mmcalidet.models.detectors import (CachedCalibrationMixin, CaliDINO,
                                        cached_head_losses)
from mmcalidet.priors import label_lists_prior
from testing import build_detector, demo_batch, get_config

CONFIG = 'calidet/calidet_dino_tiny_coco-mini_cached.py'
LABELS = ((1, 2), (3, ), (0, 5, 7))


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


def decoder_outputs(model, labels=LABELS):
    """Eval-mode decoder outputs of a demo batch, as the cache holds them,
    with the batch's data samples."""
    model.eval()
    data = model.data_preprocessor(demo_batch(labels, size=64), False)
    samples = data['data_samples']
    with torch.no_grad():
        head_inputs = model.forward_transformer(
            model.extract_feat(data['inputs']), samples)
        _, boxes = model.bbox_head(head_inputs['hidden_states'],
                                   head_inputs['references'],
                                   head_inputs['cali_vectors'])
    return head_inputs, boxes, samples


def test_cached_losses_equal_head_losses_on_images(model):
    """The cached path computes the logits the head computes from the same
    hidden states, and the per-layer DETR losses of those logits."""
    head_inputs, boxes, samples = decoder_outputs(model)
    hidden = head_inputs['hidden_states']
    labels = [ds.gt_instances.labels.numpy() for ds in samples]
    priors = torch.as_tensor(
        label_lists_prior(labels, 80), dtype=torch.float32)
    head = model.bbox_head
    with torch.no_grad():
        cali = head.get_cali_vectors(priors)
        cls, box = head(hidden, head_inputs['references'], cali)
        expected = DeformableDETRHead.loss_by_feat(
            head, cls, box, None, None, [ds.gt_instances for ds in samples],
            [ds.metainfo for ds in samples])
        got = cached_head_losses(head, hidden, boxes, samples, cali, priors)
    assert torch.equal(box, boxes)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, msg=key)
    # LoMa per decoder layer, and nothing of denoising or the encoder
    assert {'loss_loma', 'd0.loss_loma'} <= set(got)
    assert not any(k.startswith(('dn_', 'enc_')) for k in got)


def test_cached_batch_through_preprocessor_and_detector(model):
    """DecoderCachePreprocessor stacks cached items to (L, B, Q, d) and the
    EdgeSampler gives each sample a prior; images still go through
    DetDataPreprocessor."""
    head_inputs, boxes, samples = decoder_outputs(model)
    hidden = head_inputs['hidden_states']
    items = dict(
        inputs=dict(
            hidden_states=list(hidden.transpose(0, 1)),
            bbox_preds=list(boxes.transpose(0, 1))),
        data_samples=copy.deepcopy(samples))
    assert is_cached_batch(items['inputs'])
    model.train()
    data = model.data_preprocessor(items, True)
    assert torch.equal(data['inputs']['hidden_states'], hidden)
    assert all(ds.prior.shape == (80, 80) for ds in data['data_samples'])
    losses = model.loss(data['inputs'], data['data_samples'])
    assert torch.isfinite(sum(losses.values()))
    images = model.data_preprocessor(demo_batch(LABELS, size=64), False)
    assert images['inputs'].shape[:2] == (3, 3)


@pytest.mark.parametrize('train_cls', [False, True])
def test_gradients_reach_the_calibrator_only(train_cls):
    model = build_detector(CONFIG, seed=0, cache_train_cls_branches=train_cls)
    head_inputs, boxes, samples = decoder_outputs(model)
    model.train()
    inputs = dict(hidden_states=head_inputs['hidden_states'], bbox_preds=boxes)
    losses = model.loss(inputs, samples)
    sum(losses.values()).backward()
    with_grad = {
        name.split('.')[0] + '.' + name.split('.')[1]
        for name, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    expected = {'bbox_head.califormer'}
    if train_cls:
        expected.add('bbox_head.cls_branches')
    assert with_grad == expected


def _without_init(head):
    head = copy.deepcopy(head)
    head.califormer.pop('zero_init_output', None)
    return head


@pytest.mark.parametrize('name', [
    'calidet/calidet_dino_tiny_coco-mini_cached.py',
    'calidet/calidet_dino-4scale_r50_8xb2-cached_coco.py',
    'calidet/calidet_deformable-detr_tiny_coco-mini_cached.py',
    'calidet/calidet_deformable-detr_r50_8xb2-cached_coco.py',
    '../projects/context_shift/configs/'
    'calidet_dino_tiny_context-shift_cached.py',
])
def test_calibrator_configs(name):
    """Each calibrator config trains the CaliFormer alone on a decoder
    cache and keeps its parent's model, so its checkpoints are the
    parent's."""
    cfg = get_config(name)
    assert cfg.model.type == 'CachedCalibration'
    assert cfg.model.detector in ('CaliDINO', 'CaliDeformableDETR')
    assert cfg.model.data_preprocessor.type == 'DecoderCachePreprocessor'
    sampler, = cfg.model.data_preprocessor.batch_augments
    assert sampler.type == 'EdgeSampler' and sampler.noise_std == 0.16
    assert cfg.train_dataloader.dataset.type == 'DecoderCacheDataset'
    assert 'batch_sampler' not in cfg.train_dataloader  # no aspect ratios
    assert cfg.optim_wrapper.constructor == \
        'CalibratorOptimWrapperConstructor'
    assert cfg.optim_wrapper.clip_grad.max_norm == 0.1  # DINO's
    assert cfg.train_cfg.type == 'PromptIterBasedTrainLoop'
    parent = get_config(
        name.replace('_cached', '').replace('-cached_coco', '-6e_coco'))
    # the parent's head but for the CaliFormer's initial output (V' = 0:
    # the calibrator starts as the baseline), an initial value, no tensor
    assert cfg.model.bbox_head.califormer.zero_init_output is True
    assert _without_init(cfg.model.bbox_head) == \
        _without_init(parent.model.bbox_head)
    assert cfg.model.detector == parent.model.type
    assert sampler == parent.model.data_preprocessor.batch_augments[0]


def test_cached_calibration_is_the_detector_with_a_cached_loss(model):
    """The calibrator config's model is the CaliDINO (same parameters and
    buffers, so the same checkpoints, and the same inference) whose loss
    takes cached decoder outputs; the CaliDINO's own loss takes images."""
    assert isinstance(model, CaliDINO)
    assert isinstance(model, CachedCalibrationMixin)
    assert type(model).__qualname__ == 'CachedCaliDINO'
    assert type(model).__name__ == 'CaliDINO'  # as reports name it
    torch.manual_seed(0)
    plain = build_detector('calidet/calidet_dino_tiny_coco-mini.py')
    assert not isinstance(plain, CachedCalibrationMixin)
    assert set(model.state_dict()) == set(plain.state_dict())
    # images are refused with a message that names the fix
    images = model.data_preprocessor(demo_batch(LABELS, size=64), True)
    with pytest.raises(TypeError, match='cached decoder outputs.*CaliDINO'):
        model.loss(images['inputs'], images['data_samples'])
    # cached outputs given to the detector itself: the config to use
    with pytest.raises(TypeError, match="type='CachedCalibration'"):
        plain.loss(dict(hidden_states=None), images['data_samples'])
    # one class per detector type, picklable by its name
    import pickle
    assert pickle.loads(pickle.dumps(type(model))) is type(model)


def test_every_calidet_detector_has_its_twin_written_out():
    """The cached twins are classes of the module (no factory writes into
    its globals): each named Cached<Detector>, its __name__ the
    detector's; a detector without one is refused with the line to
    write."""
    from mmdet.registry import MODELS

    from mmcalidet.models.detectors import (CachedCaliDABDETR,
                                            CachedCaliDeformableDETR,
                                            CachedCaliDINO,
                                            CachedCaliFasterRCNN,
                                            CachedCaliFCOS, CachedCaliRTMDet,
                                            CalibratableDETRMixin)
    from mmcalidet.models.detectors import cached_calibration as module
    from mmcalidet.models.detectors import cached_calibration_type
    for twin in (CachedCaliDINO, CachedCaliDeformableDETR, CachedCaliDABDETR,
                 CachedCaliRTMDet, CachedCaliFCOS, CachedCaliFasterRCNN):
        detector = MODELS.get(twin.__name__)
        assert twin.__qualname__ == f'Cached{detector.__name__}'
        assert getattr(module, twin.__qualname__) is twin
        assert cached_calibration_type(detector) is twin
        assert twin.detector_type == detector.__name__
        assert twin.__mro__[1:3] == (CachedCalibrationMixin, detector)

    class CaliOther(CalibratableDETRMixin, torch.nn.Module):
        pass

    with pytest.raises(TypeError, match='write class CachedCaliOther'):
        cached_calibration_type(CaliOther)
    with pytest.raises(TypeError, match='CaliDet detector type'):
        cached_calibration_type(torch.nn.Linear)
