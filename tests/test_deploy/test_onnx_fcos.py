# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export of the tiny CaliFCOS through the dense head kind's adapter:
the graph takes the prior and ends at every location's boxes, scores and
score factors (FCOS's centerness, applied by the runtime after the
per-level top-k as mmdet applies it); ONNX Runtime gives PyTorch's
detections on real images under two priors (``verify_onnx``), and a
folded prior gives the prior input's graph."""
import os.path as osp

import numpy as np
import onnx
import pytest
import torch

from mmcalidet.deploy import (OnnxDetector, export_onnx, fold_prior,
                              read_export_meta, verify_onnx)
from mmcalidet.deploy.dense_postprocess import (dense_detections,
                                                postprocess_settings)
from testing import build_detector, data_root, random_prior

pytestmark = pytest.mark.slow

SHAPE = (128, 128)
IMAGES = [
    osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)
    for name in ('000000005001.jpg', '000000000139.jpg')
]


@pytest.fixture(scope='module')
def model():
    """A tiny CaliFCOS whose scores and V' are not the random init's."""
    model = build_detector(
        'calidet/calidet_fcos_tiny_coco-mini.py', seed=0).eval()
    head = model.bbox_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [
                *head.califormer.parameters(), *head.cls_convs.parameters(),
                *head.conv_cls.parameters(),
                *head.conv_centerness.parameters()
        ]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        head.conv_cls.bias.fill_(-3.0)  # few candidates over score_thr
    head.rho = 5.0  # a prior that moves the scores visibly
    model._cali_cache = None
    return model


@pytest.fixture(scope='module')
def exported(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('onnx') / 'fcos.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    return out


def test_the_graph_ends_at_boxes_scores_and_score_factors(model, exported):
    graph = onnx.load(exported)
    assert [i.name for i in graph.graph.input] == ['input', 'prior']
    assert [o.name for o in graph.graph.output
            ] == ['boxes', 'scores', 'score_factors']
    meta = read_export_meta(exported)
    assert meta['head'] == 'dense' and meta['model'] == 'CaliFCOS'
    # 128 x 128 at strides 8, 16, 32, 64, 128
    assert meta['level_sizes'] == [256, 64, 16, 4, 1]
    assert meta['postprocess'] == postprocess_settings(
        model.bbox_head.test_cfg)


def test_onnx_runtime_gives_pytorchs_detections_under_two_priors(
        model, exported):
    report = verify_onnx(
        exported, model, IMAGES, priors=(None, random_prior(3)), atol=1e-4)
    assert report['ok'], report['failures']
    assert report['score_shift'] > 1e-4  # the prior input is read


def test_a_folded_prior_is_the_prior_inputs_graph(model, exported, tmp_path):
    prior = random_prior(5)
    folded = str(tmp_path / 'folded.onnx')
    export_onnx(fold_prior(model, prior), folded, SHAPE, prior_input=False)
    image = IMAGES[0]
    want = OnnxDetector(exported)(image, prior=prior)
    got = OnnxDetector(folded)(image)
    assert len(got['scores']) == len(want['scores']) > 0
    np.testing.assert_allclose(got['scores'], want['scores'], atol=1e-5)
    np.testing.assert_allclose(got['bboxes'], want['bboxes'], atol=1e-3)


def test_score_factors_apply_after_the_top_k():
    """Two locations of one level: the top-1 by class score is kept, then
    its score is multiplied by its factor (a better factor does not bring
    the other one back)."""
    boxes = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32)
    scores = np.array([[0.9], [0.8]], np.float32)
    settings = dict(
        score_thr=0.05,
        nms_pre=1,
        min_bbox_size=0,
        iou_threshold=0.5,
        max_per_img=10)
    dets, labels = dense_detections(
        boxes, scores, [2], settings, score_factors=np.array([0.5, 1.0]))
    np.testing.assert_allclose(dets, [[0, 0, 10, 10, 0.45]])
    with pytest.raises(ValueError, match='score factors'):
        dense_detections(boxes, scores, [2], settings, np.ones(3))
