# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export of a one-stage CaliDet (the tiny CaliRTMDet): the graph
takes the prior and ends at every location's boxes and scores; the NumPy
post-processing is mmdet's (per-level top-k, class-aware NMS); ONNX
Runtime gives PyTorch's detections on real images under two priors,
prior input or folded."""
import os.path as osp

import numpy as np
import onnx
import pytest
import torch
from mmcv.ops import batched_nms
from mmdet.models.utils import filter_scores_and_topk

from mmcalidet.deploy import (OnnxDetector, export_onnx, fold_prior,
                              read_export_meta, verify_onnx)
from mmcalidet.deploy.dense_postprocess import (dense_detections,
                                                postprocess_settings)
from mmcalidet.deploy.verify import pair_dense_detections
from testing import build_detector, data_root, random_prior

pytestmark = pytest.mark.slow

SHAPE = (128, 128)
IMAGES = [
    osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)
    for name in ('000000005001.jpg', '000000000139.jpg')
]


@pytest.fixture(scope='module')
def model():
    """A tiny CaliRTMDet whose scores and V' are not the random init's
    (near-constant scores would tie everywhere)."""
    model = build_detector('calidet/calidet_rtmdet_tiny_coco-mini.py',
                           seed=0).eval()
    head = model.bbox_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [
                *head.califormer.parameters(), *head.cls_convs.parameters(),
                *head.rtm_cls.parameters(), *head.reg_convs.parameters()
        ]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for conv in head.rtm_cls:  # few candidates, as a trained head
            conv.bias.fill_(-6.0)
    head.rho = 5.0  # a prior that moves the scores visibly
    model._cali_cache = None
    return model


@pytest.fixture(scope='module')
def exported(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('onnx') / 'rtmdet.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    return out


def test_the_graph_takes_the_prior_and_ends_at_the_locations(model,
                                                             exported):
    graph = onnx.load(exported)
    assert [i.name for i in graph.graph.input] == ['input', 'prior']
    assert [o.name for o in graph.graph.output] == ['boxes', 'scores']
    meta = read_export_meta(exported)
    # 128 x 128 at strides 8, 16, 32
    assert meta['level_sizes'] == [256, 64, 16]
    assert meta['postprocess'] == postprocess_settings(
        model.bbox_head.test_cfg)
    assert meta['model'] == 'CaliRTMDet'


def test_onnx_runtime_gives_pytorchs_detections_under_two_priors(
        model, exported):
    report = verify_onnx(
        exported, model, IMAGES, priors=(None, random_prior(3)), atol=1e-4)
    assert report['ok'], report['failures']
    assert report['score_shift'] > 1e-4  # the prior input is read


def test_a_folded_prior_is_the_prior_inputs_graph(model, exported,
                                                  tmp_path):
    prior = random_prior(3)
    folded = fold_prior(model, prior)
    out = export_onnx(folded, str(tmp_path / 'folded.onnx'), SHAPE,
                      prior_input=False)
    assert [i.name for i in onnx.load(out).graph.input] == ['input']
    assert verify_onnx(out, folded, IMAGES[:1])['ok']
    with_prior, without = OnnxDetector(exported), OnnxDetector(out)
    for image in IMAGES:
        tensor = with_prior.preprocess(image)[0]
        paired = pair_dense_detections(
            *with_prior.run_input(tensor, prior), *without.run_input(tensor),
            atol=1e-4, max_per_img=model.bbox_head.test_cfg.max_per_img)
        assert paired is not None and len(paired[0])
        dets, labels, folded_dets, folded_labels = paired
        np.testing.assert_array_equal(labels, folded_labels)
        np.testing.assert_allclose(dets, folded_dets, atol=1e-4)


def test_the_numpy_postprocessing_is_mmdets():
    """Per-level top-k over (location, class) pairs, boxes of no size
    dropped, class-aware NMS, the best max_per_img: against mmdet's
    filter_scores_and_topk and mmcv's batched_nms on distinct scores."""
    rng = np.random.default_rng(0)
    sizes = [60, 20, 8]
    n, k = sum(sizes), 5
    xy = rng.uniform(0, 90, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0, 30, (n, 2))], 1)
    boxes[3, 2] = boxes[3, 0]  # no width: dropped
    scores = rng.permutation(n * k).reshape(n, k) / (n * k)
    settings = postprocess_settings(
        dict(
            nms_pre=40,
            min_bbox_size=0,
            score_thr=0.3,
            nms=dict(type='nms', iou_threshold=0.5),
            max_per_img=25))
    dets, labels = dense_detections(
        boxes.astype(np.float32), scores.astype(np.float32), sizes, settings)
    # mmdet's path
    tb, ts = torch.from_numpy(boxes).float(), torch.from_numpy(scores).float()
    kept_boxes, kept_scores, kept_labels, start = [], [], [], 0
    for size in sizes:
        s, lab, _, res = filter_scores_and_topk(
            ts[start:start + size], 0.3, 40,
            dict(boxes=tb[start:start + size]))
        kept_boxes.append(res['boxes'])
        kept_scores.append(s)
        kept_labels.append(lab)
        start += size
    rb, rs, rl = (torch.cat(kept_boxes), torch.cat(kept_scores),
                  torch.cat(kept_labels))
    valid = (rb[:, 2] - rb[:, 0] > 0) & (rb[:, 3] - rb[:, 1] > 0)
    rb, rs, rl = rb[valid], rs[valid], rl[valid]
    ref, keep = batched_nms(rb, rs, rl, dict(type='nms', iou_threshold=0.5))
    ref, ref_labels = ref[:25].numpy(), rl[keep][:25].numpy()
    assert 0 < len(dets) == len(ref)
    np.testing.assert_allclose(dets, ref, atol=1e-5)
    np.testing.assert_array_equal(labels, ref_labels)
    # a level's top-k is per level: a smaller nms_pre keeps fewer
    fewer, _ = dense_detections(boxes.astype(np.float32),
                                scores.astype(np.float32), sizes,
                                dict(settings, nms_pre=2))
    assert len(fewer) < len(dets)


def test_bad_settings_and_shapes_are_refused():
    with pytest.raises(ValueError, match='plain NMS'):
        postprocess_settings(dict(nms=dict(type='soft_nms')))
    for bad, name in ((dict(score_thr=float('nan')), 'score_thr'),
                      (dict(nms=dict(iou_threshold=1.5)), 'iou_threshold'),
                      (dict(max_per_img=0), 'max_per_img'),
                      (dict(min_bbox_size=float('inf')), 'min_bbox_size')):
        with pytest.raises(ValueError, match=name):
            postprocess_settings(bad)
    settings = postprocess_settings(dict())
    with pytest.raises(ValueError, match='levels'):
        dense_detections(
            np.zeros((5, 4), np.float32), np.zeros((5, 3), np.float32), [4],
            settings)
