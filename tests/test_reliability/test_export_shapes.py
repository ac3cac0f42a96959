# Copyright (c) mmcalidet contributors. All rights reserved.
"""Exports refuse what they cannot reproduce, and ``--verify`` says what it
compared: a shape the model's ``pad_size_divisor`` does not divide is
refused in one line (the library and the tool, before anything is built);
at a shape it divides, ONNX Runtime gives ``inference_detector``'s
detections with the graph's resize; a verification that pairs fewer than
``min_paired`` detections tries further inputs and the trace's own, then
fails with the paired count."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch

from mmcalidet.apis import inference_detector
from mmcalidet.deploy import OnnxDetector, export_onnx, verify_onnx
from mmcalidet.deploy.export import padding_problem
from testing import build_detector, data_root, random_prior
from testing._utils import run_tool_in_process

CONFIG = 'calidet/calidet_fcos_tiny_coco-mini.py'
SHAPE = (64, 64)  # a multiple of the tiny FCOS's pad_size_divisor, 32
IMAGES = [
    osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)
    for name in ('000000005001.jpg', '000000000139.jpg')
]


@pytest.fixture(scope='module')
def model():
    """The tiny CaliFCOS with scores over its score_thr at some locations
    (as tests/test_deploy/test_onnx_fcos.py makes it)."""
    model = build_detector(CONFIG, seed=0).eval()
    head = model.bbox_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [
                *head.califormer.parameters(), *head.cls_convs.parameters(),
                *head.conv_cls.parameters(),
                *head.conv_centerness.parameters()
        ]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        head.conv_cls.bias.fill_(-3.0)
    head.rho = 5.0
    model._cali_cache = None
    return model


@pytest.fixture(scope='module')
def exported(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('shapes') / 'fcos.onnx')
    return export_onnx(model, out, SHAPE, prior_input=True)


def test_a_shape_the_pad_divisor_does_not_divide_is_refused(model, tmp_path):
    assert padding_problem(model, SHAPE) is None
    out = str(tmp_path / 'odd.onnx')
    with pytest.raises(ValueError) as info:
        export_onnx(model, out, (33, 47), prior_input=True)
    message = str(info.value)
    assert '\n' not in message and '33 x 47' in message
    assert 'pad_size_divisor' in message and '64 x 64' in message
    assert not osp.exists(out)
    # a DETR whose preprocessor pads to 1 takes any size
    dino = build_detector('calidet/calidet_dino_tiny_coco-mini.py', seed=0)
    assert padding_problem(dino, (33, 47)) is None


def test_the_tool_refuses_the_shape_before_it_builds_anything(tmp_path):
    out = str(tmp_path / 'odd.onnx')
    res = run_tool_in_process('tools/deployment/export_onnx.py',
                              f'configs/{CONFIG}', 'none', '--out', out,
                              '--shape', '100', '100', '--verify')
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith('export_onnx.py: error: --shape 100 100'), last
    assert 'pad_size_divisor' in last and '--shape 128 128' in last
    assert 'exporting' not in res.stdout and not osp.exists(out)


def test_the_graph_gives_inference_detectors_detections(model, exported):
    """The equality deploy.md states: the PyTorch API with the graph's
    resize (no aspect ratio kept) at a shape the divisor divides."""
    detector = OnnxDetector(exported)
    reference = copy.deepcopy(model)
    pipeline = reference.cfg.test_dataloader.dataset.pipeline
    resize = [i for i, s in enumerate(pipeline) if s['type'] == 'Resize'][0]
    pipeline[resize] = dict(
        type='Resize', scale=(SHAPE[1], SHAPE[0]), keep_ratio=False)
    prior = random_prior(3)
    got = detector(IMAGES, prior=prior)
    want = inference_detector(reference, IMAGES, prior=prior)
    assert sum(len(r['scores']) for r in got) > 0
    for result, sample in zip(got, want):
        pred = sample.pred_instances
        assert len(result['scores']) == len(pred.scores)
        # tied scores may come in either order: compare sorted
        np.testing.assert_allclose(
            np.sort(result['scores']), np.sort(pred.scores.numpy()), atol=1e-4)
        np.testing.assert_allclose(
            np.sort(result['bboxes'], axis=0),
            np.sort(pred.bboxes.numpy(), axis=0),
            atol=1e-3)


def test_verify_reports_the_pairs_and_fails_on_too_few(model, exported):
    report = verify_onnx(exported, model, IMAGES[:1], (None, random_prior(3)))
    assert report['ok'], report['failures']
    assert report['paired'] > 0 and report['retried'] == 0
    assert report['paired'] == sum(report['paired_per_input'])
    assert report['padding'] is None
    # more than any input gives: the fallback image, then the trace's own
    # input are compared, and the check fails naming the count
    need = 10**6
    report = verify_onnx(
        exported, model, IMAGES[:1], min_paired=need, fallback=IMAGES[1:])
    assert not report['ok'] and report['retried'] == 2
    assert report['images'] == 3
    assert len(report['paired_per_input']) == 3
    failure, = report['failures']
    assert f'only {report["paired"]} detection(s) paired' in failure
    assert f'at least {need}' in failure
