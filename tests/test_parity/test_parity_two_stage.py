# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmdet's two-stage detector test (tests/test_models/test_detectors/
test_two_stage.py) on CaliFasterRCNN, built by ``MODELS.build`` from our
tiny config and the paper's (with mmdet's test's ResNet-18 for its
ResNet-50): init (and an RPN of one class whatever its config says), then
the loss, predict and tensor modes on mmdet's demo batch; mmdet skips
those without a GPU, here they run on the CPU. Also the named prior's
warnings (once from the EdgeSampler, once from the model) and the refusal
of class names that are not the prior's."""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs

TINY = 'calidet_faster-rcnn_tiny_coco-mini.py'
PAPER = 'calidet_faster-rcnn_r50_fpn_1x_coco.py'
SHAPES = [[3, 128, 128], [3, 125, 130]]


@pytest.fixture(
    scope='module',
    params=[pytest.param(TINY, id='tiny'),
            pytest.param(PAPER, id='paper')])
def config(request, model_config):
    cfg = model_config(request.param)
    # mmdet's test turns the ResNet-50 into a ResNet-18 (the tiny config's)
    cfg.backbone.depth = 18
    cfg.neck.in_channels = [64, 128, 256, 512]
    return cfg


@pytest.fixture(scope='module')
def detector(config):
    """Built without ``init_weights``, as mmdet's test builds it; only the
    loss test trains it."""
    torch.manual_seed(0)
    return MODELS.build(copy.deepcopy(config))


def test_init(config, detector):
    assert detector.backbone
    assert detector.neck
    assert detector.rpn_head
    assert detector.roi_head
    assert type(detector).__name__ == 'CaliFasterRCNN'
    assert type(detector.roi_head.bbox_head).__name__ == \
        'CaliShared2FCBBoxHead'
    # an RPN configured with 2 classes is built with 1
    cfg = copy.deepcopy(config)
    cfg.rpn_head.num_classes = 2
    assert MODELS.build(cfg).rpn_head.num_classes == 1


def test_forward_loss_mode(detector, edge_sampler_draws):
    detector.train()
    losses = edge_sampler_draws(detector, demo_mm_inputs(2, SHAPES))
    assert isinstance(losses, dict)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_loma'} <= \
        set(losses)


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
    cls_score, _ = outputs[-1]  # the RoI head's: K classes + background
    assert cls_score.shape[-1] == detector.roi_head.bbox_head.num_classes + 1


def test_other_class_names_are_refused(model_config, class_order, message_hub):
    class_order(
        model_config(TINY), demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]),
        message_hub)
