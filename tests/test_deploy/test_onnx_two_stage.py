# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export of a two-stage CaliDet (the tiny CaliFasterRCNN): the graph
takes the prior, runs the RPN's NMS inside and ends at every RoI's
per-class boxes and scores; the NumPy post-processing is mmdet's
``multiclass_nms``; ONNX Runtime gives PyTorch's detections on real images
under two priors, prior input or folded, and on inputs of other sizes
whose RPN keeps other numbers of proposals than the trace's; the trace's
rewrites are mmdet's and mmcv's results and are undone afterwards. The
detectors' box heads are narrower than the configs'
(:mod:`testing.narrow_models`: the same operators, half the graph)."""
import contextlib
import os.path as osp

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mmcv.ops import nms
from mmcv.ops.nms import NMSop
from mmdet.models.layers import multiclass_nms
from mmengine.runner import save_checkpoint
from mmengine.structures import InstanceData

from mmcalidet.deploy import (OnnxDetector, export_onnx, fold_prior,
                              read_export_meta, verify_onnx)
from mmcalidet.deploy.roi_postprocess import (roi_detections,
                                              roi_postprocess_settings)
from mmcalidet.deploy.two_stage_export import (RoIExportWrapper,
                                               masked_levels_forward,
                                               nms_symbolic,
                                               two_stage_rewrites)
from mmcalidet.deploy.verify import (pair_dense_detections, query_boxes,
                                     synthetic_images)
from testing import data_root, random_prior, run_tool
from testing.narrow_models import NARROW_OPTION, build_narrow_two_stage

pytestmark = pytest.mark.slow

SHAPE = (128, 128)
IMAGES = [
    osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)
    for name in ('000000005001.jpg', '000000000139.jpg')
]


@pytest.fixture(scope='module')
def model():
    """A tiny CaliFasterRCNN whose box head and V' are not the random
    init's (a flat softmax would score every class alike)."""
    model = build_narrow_two_stage(
        'calidet/calidet_faster-rcnn_tiny_coco-mini.py', seed=0).eval()
    head = model.roi_head.bbox_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.califormer.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for p in (head.fc_cls.weight, head.fc_reg.weight):
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    head.rho = 5.0  # a prior that moves the scores visibly
    model._cali_cache = None
    return model


@pytest.fixture(scope='module')
def exported(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('onnx') / 'faster_rcnn.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    return out


@contextlib.contextmanager
def rpn_max_per_img(model, max_per_img):
    """Inside the block, the RPN keeps up to ``max_per_img`` proposals
    (``None``: the config's), in PyTorch and in an export."""
    cfg = model.rpn_head.test_cfg
    kept = cfg.max_per_img
    if max_per_img is not None:
        cfg.max_per_img = max_per_img
    try:
        yield
    finally:
        cfg.max_per_img = kept


def traced_rois(model, shape):
    """The RoIs the RPN keeps on the trace's input (all zeros)."""
    zeros = torch.zeros(1, 3, *shape)
    return len(query_boxes(model, zeros)) // \
        model.roi_head.bbox_head.num_classes


def test_the_graph_takes_the_prior_and_ends_at_the_rois(model, exported):
    graph = onnx.load(exported)
    assert [i.name for i in graph.graph.input] == ['input', 'prior']
    assert [o.name for o in graph.graph.output] == ['boxes', 'scores']
    ops = {node.op_type for node in graph.graph.node}
    assert {'NonMaxSuppression', 'RoiAlign'} <= ops  # the RPN and RoIs
    meta = read_export_meta(exported)
    assert meta['head'] == 'roi' and meta['model'] == 'CaliFasterRCNN'
    assert meta['postprocess'] == roi_postprocess_settings(
        model.roi_head.test_cfg)
    boxes, scores = ort.InferenceSession(exported).run(
        None,
        dict(
            input=np.zeros((1, 3) + SHAPE, np.float32),
            prior=np.eye(80, dtype=np.float32)))
    # at most the RPN's max_per_img RoIs, each with a box per class
    assert boxes.shape[1:] == (80, 4) and scores.shape[1] == 80
    assert 0 < len(boxes) <= model.test_cfg.rpn.max_per_img
    assert (scores.sum(1) < 1).all()  # the background left out


def test_onnx_runtime_gives_pytorchs_detections_under_two_priors(
        model, exported):
    report = verify_onnx(
        exported, model, IMAGES, priors=(None, random_prior(3)), atol=1e-4)
    assert report['ok'], report['failures']
    assert report['counts_equal'] and report['boxes_fixed']
    assert report['score_shift'] > 1e-3  # the prior input is read


@pytest.mark.parametrize(
    'shape, max_per_img, varies', [((32, 64), None, True),
                                   (SHAPE, None, False),
                                   ((320, 320), None, False),
                                   (SHAPE, 2000, True)],
    ids=['32x64', '128', '320', '128-rpn2000'])
def test_a_graph_runs_on_as_many_rois_as_its_input_gives(
        model, tmp_path, request, shape, max_per_img, varies):
    """The number of RoIs is the input's, not the trace's: a small input
    or an RPN whose ``max_per_img`` is not reached keeps other numbers of
    proposals on other images (a grey one without objects, noise), and
    the graph gives PyTorch's detections on each (800 x 800 is checked by
    a script: minutes on two cores)."""
    with rpn_max_per_img(model, max_per_img):
        if shape == SHAPE and max_per_img is None:
            out = request.getfixturevalue('exported')
        else:
            out = export_onnx(
                model, str(tmp_path / 'rois.onnx'), shape, prior_input=True)
        traced = traced_rois(model, shape)
        report = verify_onnx(out, model, IMAGES[:1])
    assert report['ok'], report['failures']
    # the real image and the two of synthetic_images; the blank one runs
    assert report['images'] == 3 and report['counts_equal']
    assert report['blank_error'] is None
    limit = max_per_img or model.test_cfg.rpn.max_per_img
    assert 0 < min(report['rois']) and max(report['rois']) <= limit
    if varies:  # inputs of another number of RoIs than the trace's
        assert any(n != traced for n in report['rois']), (traced, report)
    detector = OnnxDetector(out)
    assert len(detector(IMAGES[0])['scores'])  # detections were compared
    grey = detector(synthetic_images(shape)[0])  # no objects
    assert grey['bboxes'].shape == (len(grey['scores']), 4)
    assert len(grey['labels']) == len(grey['scores'])


def test_a_folded_prior_is_the_prior_inputs_graph(model, exported, tmp_path):
    prior = random_prior(3)
    folded = fold_prior(model, prior)
    assert folded.roi_head.bbox_head.rho == 0.0
    assert model.roi_head.bbox_head.rho == 5.0  # the model is unchanged
    out = export_onnx(
        folded, str(tmp_path / 'folded.onnx'), SHAPE, prior_input=False)
    assert [i.name for i in onnx.load(out).graph.input] == ['input']
    assert verify_onnx(out, folded, IMAGES[:1], synthetic=False)['ok']
    with_prior, without = OnnxDetector(exported), OnnxDetector(out)
    tensor = with_prior.preprocess(IMAGES[1])[0]
    paired = pair_dense_detections(
        *with_prior.run_input(tensor, prior),
        *without.run_input(tensor),
        atol=1e-4,
        max_per_img=model.roi_head.test_cfg.max_per_img)
    assert paired is not None and len(paired[0])
    np.testing.assert_array_equal(paired[1], paired[3])
    np.testing.assert_allclose(paired[0], paired[2], atol=1e-4)


def test_a_plain_faster_rcnn_exports_without_a_prior(tmp_path):
    plain = build_narrow_two_stage(
        'calidet/faster-rcnn_tiny_coco-mini.py').eval()
    with torch.no_grad():  # a class over score_thr: detections to compare
        plain.roi_head.bbox_head.fc_cls.bias[0] += 4.0
    out = export_onnx(
        plain, str(tmp_path / 'plain.onnx'), SHAPE, prior_input=False)
    assert read_export_meta(out)['head'] == 'roi'
    report = verify_onnx(out, plain, IMAGES[:1], synthetic=False)
    assert report['ok'], report['failures']
    with pytest.raises(ValueError, match='takes no prior'):
        export_onnx(plain, str(tmp_path / 'x.onnx'), SHAPE, prior_input=True)


def test_the_rewrites_are_undone_after_the_export(model, exported):
    extractor = model.roi_head.bbox_roi_extractor
    assert 'symbolic' not in vars(NMSop)
    for owner, name in ((extractor, 'forward'), (model.rpn_head,
                                                 '_bbox_post_process'),
                        (model.rpn_head.bbox_coder, 'decode')):
        assert name not in vars(owner)
    with two_stage_rewrites(model):
        assert 'forward' in vars(extractor) and 'symbolic' in vars(NMSop)
    assert 'forward' not in vars(extractor)
    assert 'symbolic' not in vars(NMSop)


def test_the_masked_levels_are_mmdets_extractor(model):
    """Every RoI pooled on its own level, levels left empty included."""
    extractor = model.roi_head.bbox_roi_extractor
    gen = torch.Generator().manual_seed(0)
    feats = tuple(
        torch.randn(
            1, extractor.out_channels, 128 // s, 128 // s, generator=gen)
        for s in extractor.featmap_strides)
    for sides in ((10., 40., 90., 120.), (10., 12.)):  # some levels empty
        corners = torch.rand(len(sides), 2, generator=gen) * 4
        side = torch.tensor(sides)[:, None]
        rois = torch.cat([torch.zeros(len(sides), 1), corners, corners + side],
                         1)
        with torch.no_grad():
            ref = extractor(feats, rois)
            out = masked_levels_forward(extractor, feats, rois)
        torch.testing.assert_close(out, ref)


class ProposalsAndDecode(torch.nn.Module):
    """The rewritten RPN post-processing and the box head's decode: the
    part of the graph whose rows are as many as its input's boxes give."""

    def __init__(self, model):
        super().__init__()
        self.rpn_head = model.rpn_head
        self.coder = model.roi_head.bbox_head.bbox_coder

    def forward(self, boxes, scores, level_ids, deltas):
        results = InstanceData(
            bboxes=boxes, scores=scores, level_ids=level_ids)
        proposals = self.rpn_head._bbox_post_process(results,
                                                     self.rpn_head.test_cfg)
        rois = proposals.bboxes
        decoded = self.coder.decode(
            rois, deltas.expand(rois.shape[0], -1), max_shape=(90, 120))
        return rois, proposals.scores, decoded


def test_the_rpn_and_the_decode_take_any_number_of_boxes(model, tmp_path):
    """Traced on 60 boxes, run on 60, 25 and none that the RPN keeps:
    mmdet's proposals and boxes each time."""
    gen = torch.Generator().manual_seed(0)

    def boxes_of(n, size=30.):
        xy = torch.rand(n, 2, generator=gen) * 80
        wh = 1 + torch.rand(n, 2, generator=gen) * size
        return (torch.cat([xy, xy + wh], 1), torch.rand(n, generator=gen),
                torch.randint(0, 5, (n, ), generator=gen))

    k = model.roi_head.bbox_head.num_classes
    deltas = torch.randn(1, 4 * k, generator=gen) * 0.1
    module, out = ProposalsAndDecode(model), str(tmp_path / 'rpn.onnx')
    names = ['boxes', 'scores', 'level_ids']
    with two_stage_rewrites(model):
        torch.onnx.export(
            module, (*boxes_of(60), deltas),
            out,
            input_names=names + ['deltas'],
            dynamic_axes={name: {
                0: 'n'
            }
                          for name in names},
            opset_version=17,
            dynamo=False)
    session = ort.InferenceSession(out)
    empty = boxes_of(25)
    empty[0][:, 2] = empty[0][:, 0]  # no width: the RPN keeps none
    for inputs in (boxes_of(60), boxes_of(25), empty):
        rois, scores, decoded = session.run(
            None, {
                name: value.numpy()
                for name, value in zip(names + ['deltas'], (*inputs, deltas))
            })
        results = InstanceData(
            bboxes=inputs[0], scores=inputs[1], level_ids=inputs[2])
        ref = model.rpn_head._bbox_post_process(results,
                                                model.rpn_head.test_cfg)
        assert rois.shape == (len(ref), 4) and decoded.shape == (len(ref),
                                                                 4 * k)
        np.testing.assert_allclose(rois, ref.bboxes.numpy(), atol=1e-5)
        np.testing.assert_allclose(scores, ref.scores.numpy(), atol=1e-6)
        if len(ref):
            ref_decoded = model.roi_head.bbox_head.bbox_coder.decode(
                ref.bboxes, deltas.expand(len(ref), -1), max_shape=(90, 120))
            np.testing.assert_allclose(decoded, ref_decoded.numpy(), atol=1e-4)
    assert len(ref) == 0  # the last: no proposal


def test_the_nms_symbolic_is_mmcvs_nms(tmp_path):
    """ONNX's NonMaxSuppression keeps mmcv's boxes in mmcv's order."""

    class NMS(torch.nn.Module):

        def forward(self, boxes, scores):
            return nms(boxes, scores, 0.5)[1]

    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(60, 2, generator=gen) * 50
    boxes = torch.cat([xy, xy + 5 + torch.rand(60, 2, generator=gen) * 30], 1)
    scores = torch.randperm(60, generator=gen).float() / 60
    NMSop.symbolic = staticmethod(nms_symbolic)
    try:
        torch.onnx.export(
            NMS(), (boxes, scores),
            str(tmp_path / 'nms.onnx'),
            input_names=['boxes', 'scores'],
            opset_version=17,
            dynamo=False)
    finally:
        del NMSop.symbolic
    keep = ort.InferenceSession(str(tmp_path / 'nms.onnx')).run(
        None, dict(boxes=boxes.numpy(), scores=scores.numpy()))[0]
    ref = nms(boxes, scores, 0.5)[1]
    assert 1 < len(ref) < 60
    np.testing.assert_array_equal(keep, ref.numpy())


def test_the_numpy_postprocessing_is_mmdets_multiclass_nms():
    rng = np.random.default_rng(0)
    n, k = 40, 4
    xy = rng.uniform(0, 90, (n, k, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 30, (n, k, 2))], 2)
    scores = rng.permutation(n * k).reshape(n, k) / (n * k + 1)
    cfg = dict(
        score_thr=0.3, nms=dict(type='nms', iou_threshold=0.5), max_per_img=30)
    dets, labels = roi_detections(
        boxes.astype(np.float32), scores.astype(np.float32),
        roi_postprocess_settings(cfg))
    with_bg = np.concatenate([scores, 1 - scores.sum(1, keepdims=True)], 1)
    ref, ref_labels = multiclass_nms(
        torch.from_numpy(boxes.reshape(n, -1)).float(),
        torch.from_numpy(with_bg).float(), 0.3, cfg['nms'], 30)
    assert 0 < len(dets) == len(ref)
    np.testing.assert_allclose(dets, ref.numpy(), atol=1e-5)
    np.testing.assert_array_equal(labels, ref_labels.numpy())
    # as many RoIs as the graph gives: a few, none
    for rows in (1, 0):
        dets, labels = roi_detections(boxes[:rows].astype(np.float32),
                                      scores[:rows].astype(np.float32),
                                      roi_postprocess_settings(cfg))
        assert dets.shape == (len(labels), 5) and len(labels) <= rows * k


def test_bad_settings_shapes_and_heads_are_refused(model):
    with pytest.raises(ValueError, match='plain NMS'):
        roi_postprocess_settings(dict(nms=dict(type='soft_nms')))
    with pytest.raises(ValueError, match='max_per_img'):
        roi_postprocess_settings(dict(max_per_img=0))
    settings = roi_postprocess_settings(dict())
    boxes = np.zeros((5, 3, 4), np.float32)
    scores = np.zeros((5, 3), np.float32)
    for bad, name in ((dict(settings, score_thr=float('nan')), 'score_thr'),
                      (dict(settings, iou_threshold=1.5), 'iou_threshold'),
                      (dict(settings, max_per_img=0), 'max_per_img')):
        with pytest.raises(ValueError, match=name):
            roi_detections(boxes, scores, bad)
    with pytest.raises(ValueError, match=r'\(N, K, 4\)'):
        roi_detections(
            np.zeros((5, 4), np.float32), np.zeros((5, 3), np.float32),
            roi_postprocess_settings(dict()))
    extractor = model.roi_head.bbox_roi_extractor
    layer = extractor.roi_layers[0]
    layer.pool_mode = 'max'
    try:
        with pytest.raises(ValueError, match='average RoIAlign'):
            RoIExportWrapper(model, SHAPE, True)
    finally:
        layer.pool_mode = 'avg'


def test_the_export_tool_verifies_a_two_stage_checkpoint(model, tmp_path):
    checkpoint = str(tmp_path / 'califasterrcnn.pth')
    state = model.state_dict()  # rho is not saved: a class over score_thr
    state['roi_head.bbox_head.fc_cls.bias'] = \
        state['roi_head.bbox_head.fc_cls.bias'].clone()
    state['roi_head.bbox_head.fc_cls.bias'][0] += 4.0
    save_checkpoint(dict(state_dict=state), checkpoint)
    out = str(tmp_path / 'tool.onnx')
    res = run_tool('tools/deployment/export_onnx.py',
                   'configs/calidet/calidet_faster-rcnn_tiny_coco-mini.py',
                   checkpoint, '--out', out, '--shape', *map(str, SHAPE),
                   '--verify', '--verify-prior', 'coco2017_val',
                   '--cfg-options', NARROW_OPTION)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'verified: ONNX Runtime agrees with PyTorch' in res.stdout
    assert 'no box: True' in res.stdout
    assert read_export_meta(out)['head'] == 'roi'
