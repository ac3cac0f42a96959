# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmdet's single-stage detector test (tests/test_models/test_detectors/
test_single_stage.py) on CaliRTMDet, built by ``MODELS.build`` from our
tiny config and the paper's, and on CaliFCOS (the head-kind adapters' new
family) from its tiny config: init, then the loss, predict and tensor
modes on mmdet's demo batch (128 x 128 and 125 x 130 images), on the CPU;
the named prior's warnings (once from the EdgeSampler, once from the
model) and the refusal of class names that are not the prior's.

The paper's config keeps mmdet's RTMDet data preprocessor, which pads
nothing (its pipeline pads every image to 640 px): on the 125 x 130 image
the CSPNeXt neck cannot join levels of 9 and 10 rows, for mmdet's own
RTMDet as for ours (the last test), and mmdet's test runs no RTMDet. Its
forward tests here pad to 32 px, as the tiny config does.
"""
import copy
import os.path as osp

import mmdet
import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config

TINY = 'calidet_rtmdet_tiny_coco-mini.py'
PAPER = 'calidet_rtmdet_tiny_8xb32-300e_coco.py'
FCOS = 'calidet_fcos_tiny_coco-mini.py'
SHAPES = [[3, 128, 128], [3, 125, 130]]
#: detector -> its head, levels (strides) and the head's losses
EXPECTED = {
    'CaliRTMDet': ('CaliRTMDetHead', 3, {'loss_cls', 'loss_bbox'}),
    'CaliFCOS':
    ('CaliFCOSHead', 5, {'loss_cls', 'loss_bbox', 'loss_centerness'}),
}


@pytest.fixture(
    scope='module',
    params=[
        pytest.param(TINY, id='tiny'),
        pytest.param(PAPER, id='paper'),
        pytest.param(FCOS, id='fcos')
    ])
def config(request, model_config):
    cfg = model_config(request.param)
    cfg.data_preprocessor.pad_size_divisor = 32  # the tiny config's
    return cfg


@pytest.fixture(scope='module')
def detector(config):
    """Built and initialised, as mmdet's loss test does (its predict and
    tensor tests skip ``init_weights``); only the loss test trains it."""
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(config))
    model.init_weights()
    return model


def test_init(detector, config):
    assert detector.backbone
    assert detector.neck
    assert detector.bbox_head
    assert type(detector).__name__ == config.type
    assert type(detector.bbox_head).__name__ == EXPECTED[config.type][0]
    # the EdgeSampler got the head's K and the model's prior as E_t
    (_, sampler), = detector.edge_samplers()
    assert sampler.num_classes == detector.num_classes == 80
    np.testing.assert_allclose(
        sampler.dataset_prior, detector.get_prior(), atol=1e-6)


def test_forward_loss_mode(detector, message_hub, edge_sampler_draws):
    detector.train()
    losses = edge_sampler_draws(detector, demo_mm_inputs(2, SHAPES))
    assert isinstance(losses, dict)
    losses_of_head = EXPECTED[type(detector).__name__][2]
    assert losses_of_head | {'loss_loma'} <= set(losses)


def test_forward_predict_mode(detector):
    detector.eval()
    with torch.no_grad():
        data = detector.data_preprocessor(demo_mm_inputs(2, SHAPES), False)
        results = detector.forward(**data, mode='predict')
    assert len(results) == 2
    assert all(isinstance(result, DetDataSample) for result in results)
    assert all('pred_instances' in result for result in results)


def test_forward_tensor_mode(detector):
    detector.train()
    data = detector.data_preprocessor(demo_mm_inputs(2, SHAPES), False)
    outputs = detector.forward(**data, mode='tensor')
    assert isinstance(outputs, tuple)
    cls_scores = outputs[0]
    # one per stride
    assert len(cls_scores) == EXPECTED[type(detector).__name__][1]
    assert all(score.shape[:2] == (2, 80) for score in cls_scores)


@pytest.mark.parametrize('name', [TINY, FCOS])
def test_other_class_names_are_refused(name, model_config, class_order,
                                       message_hub):
    class_order(
        model_config(name), demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]),
        message_hub)


def test_unpadded_paper_config_fails_as_mmdet_rtmdet_does(model_config):
    """Without padding, the 125 x 130 image stops ours where it stops
    mmdet's RTMDet: in the neck, with the same error."""
    mmdet_config = osp.join(
        osp.dirname(mmdet.__file__), '.mim', 'configs', 'rtmdet',
        'rtmdet_tiny_8xb32-300e_coco.py')
    theirs = Config.fromfile(mmdet_config).model
    ours = model_config(PAPER)
    assert 'pad_size_divisor' not in ours.data_preprocessor
    errors = []
    for cfg in (theirs, ours):
        cfg.backbone.init_cfg = None
        model = MODELS.build(cfg)
        data = model.data_preprocessor(demo_mm_inputs(2, SHAPES), False)
        with pytest.raises(RuntimeError, match='Sizes of tensors') as error:
            model.forward(**data, mode='tensor')
        errors.append(str(error.value))
    assert errors[0] == errors[1]
