# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export with the prior as an input (or folded), run in ONNX Runtime:
the same detections as PyTorch on real coco-mini images under two priors,
for the tiny CaliDINO and CaliDeformableDETR."""
import copy
import os.path as osp

import numpy as np
import onnx
import pytest
import torch
from mmdet.datasets import CocoDataset

from mmcalidet.apis import inference_detector
from mmcalidet.deploy import (ExportWrapper, OnnxDetector, export_onnx,
                              fold_prior, read_export_meta, verify_onnx)
from testing import build_detector, data_root

# exports two detectors and runs ONNX Runtime: the slow tier
pytestmark = pytest.mark.slow

K = 80
SHAPE = (256, 256)
CONFIGS = {
    'dino': 'calidet/calidet_dino_tiny_coco-mini.py',
    'deformable-detr': 'calidet/calidet_deformable-detr_tiny_coco-mini.py',
}
CLASSES = list(CocoDataset.METAINFO['classes'])


def val_image(name):
    return osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)


IMAGES = [val_image('000000005001.jpg'), val_image('000000000139.jpg')]


def random_prior(seed):
    prior = np.random.default_rng(seed).uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def tiny(name):
    model = build_detector(CONFIGS[name], seed=0).eval()
    model.dataset_meta = dict(classes=CLASSES)
    return model


@pytest.fixture(scope='module', params=sorted(CONFIGS))
def exported(request, tmp_path_factory):
    """(name, model, file) of a prior-input export."""
    model = tiny(request.param)
    out = str(tmp_path_factory.mktemp('onnx') / f'{request.param}.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    return request.param, model, out


def test_the_graph_takes_the_prior_and_gives_mmdeploy_outputs(exported):
    _, model, out = exported
    graph = onnx.load(out)
    inputs = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in graph.graph.input
    }
    assert inputs == dict(input=[1, 3, *SHAPE], prior=[K, K])
    assert [o.name for o in graph.graph.output] == ['dets', 'labels']
    meta = read_export_meta(out)
    assert meta['classes'] == CLASSES and meta['prior_input'] is True
    np.testing.assert_allclose(meta['prior'], model.get_prior())


def test_onnx_runtime_agrees_with_pytorch_under_two_priors(exported):
    _, model, out = exported
    report = verify_onnx(
        out, model, IMAGES, [None, random_prior(1)], atol=1e-4)
    assert report['ok'], report['failures']
    assert report['max_box_diff'] <= 1e-4
    assert report['max_score_diff'] <= 1e-4
    # the priors moved the scores, and every box is a query's under both
    assert report['score_shift'] > 0 and report['boxes_fixed']


def test_a_folded_prior_is_the_calibrated_detector_under_it(
        exported, tmp_path):
    name, model, _ = exported
    prior = random_prior(2)
    folded = fold_prior(model, prior)
    assert not np.allclose(model.get_prior(), prior)  # the model unchanged
    out = export_onnx(
        folded, str(tmp_path / 'folded.onnx'), SHAPE, prior_input=False)
    graph = onnx.load(out)
    assert [i.name for i in graph.graph.input] == ['input']
    assert not [
        t.name for t in graph.graph.initializer if 'califormer' in t.name
    ]
    detector = OnnxDetector(out)
    calibrated = ExportWrapper(model, SHAPE, prior_input=True)
    for image in IMAGES:
        tensor, _, _ = detector.preprocess(image)
        dets, labels = detector.run_input(tensor)
        with torch.no_grad():
            want, want_labels = calibrated(
                torch.from_numpy(tensor),
                torch.as_tensor(prior, dtype=torch.float32))
        np.testing.assert_allclose(dets, want.numpy(), atol=1e-4)
        np.testing.assert_array_equal(labels, want_labels.numpy())
    # its prior is in its weights: none at run time
    with pytest.raises(ValueError, match='folded'):
        detector(IMAGES[0], prior='coco2017_val')


def test_the_onnx_detector_returns_what_the_pytorch_api_does(exported):
    _, model, out = exported
    detector = OnnxDetector(out)
    # the PyTorch API with the graph's resize (no aspect ratio kept)
    model = copy.deepcopy(model)
    pipeline = model.cfg.test_dataloader.dataset.pipeline
    resize = [
        i for i, step in enumerate(pipeline) if step['type'] == 'Resize'
    ][0]
    pipeline[resize] = dict(
        type='Resize', scale=(SHAPE[1], SHAPE[0]), keep_ratio=False)
    for prior in ('coco2017_val', random_prior(3)):
        got = detector(IMAGES, prior=prior)
        want = inference_detector(model, IMAGES, prior=prior)
        for result, sample in zip(got, want):
            pred = sample.pred_instances
            np.testing.assert_allclose(
                result['bboxes'], pred.bboxes.numpy(), atol=1e-3)
            np.testing.assert_allclose(
                result['scores'], pred.scores.numpy(), atol=1e-4)
            np.testing.assert_array_equal(result['labels'],
                                          pred.labels.numpy())
            assert result['label_names'] == [
                CLASSES[k] for k in pred.labels.tolist()
            ]
    assert OnnxDetector.to_json(got[0])['scores'] == got[0]['scores'].tolist()


@pytest.mark.parametrize('prior,problem', [
    (np.eye(3), 'K=3 classes, expected 80'),
    (np.full((K, K), np.nan), 'non-finite value nan'),
    (np.full((K, K), 1.5), r'must lie in \[0, 1\]'),
    (dict(
        classes=[c if c != 'dog' else 'dgo' for c in CLASSES],
        matrix=np.eye(K).tolist()), "class 'dog' is not in the prior"),
    ('no_such_prior.json', 'not found'),
])
def test_bad_priors_are_refused_before_onnx_runtime_runs(
        exported, prior, problem, monkeypatch):
    _, _, out = exported
    detector = OnnxDetector(out)

    def must_not_run(*args, **kwargs):
        raise AssertionError('ONNX Runtime ran')

    monkeypatch.setattr(detector, 'session',
                        type('S', (), dict(run=must_not_run))())
    with pytest.raises(ValueError, match=problem) as info:
        detector(IMAGES[0], prior=prior)
    assert '\n' not in str(info.value)


def test_a_plain_detector_exports_without_a_prior(tmp_path):
    plain = build_detector('calidet/dino_tiny_coco-mini.py', seed=0).eval()
    with pytest.raises(ValueError, match='takes no prior'):
        export_onnx(plain, str(tmp_path / 'x.onnx'), SHAPE, prior_input=True)
    assert not osp.exists(tmp_path / 'x.onnx')
    out = export_onnx(
        plain, str(tmp_path / 'plain.onnx'), SHAPE, prior_input=False)
    report = verify_onnx(out, plain, IMAGES[:1])
    assert report['ok'], report['failures']
    # told that it takes none, not that its prior is folded
    with pytest.raises(ValueError, match='DINO, which takes no prior'):
        OnnxDetector(out).resolve_prior('coco2017_val')


def test_export_leaves_the_model_in_eval_mode(tmp_path):
    model = tiny('dino')
    export_onnx(model, str(tmp_path / 'm.onnx'), (64, 64))
    assert not model.training
    assert not any(m.training for m in model.modules())
