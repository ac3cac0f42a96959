# Copyright (c) mmcalidet contributors. All rights reserved.
"""Every runtime resolves a prior through the ``Prior`` that ``set_prior``
takes, so its support travels: ``onnx_demo.py`` on a support-aware graph
draws what ``OnnxDetector(...)(img, prior=file)`` gives (not the bare
matrix's detections), the export's stored prior keeps its support, and no
tool calls a resolver that returns the matrix only."""
import json
import os.path as osp
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset

from mmcalidet.deploy import OnnxDetector, export_onnx
from mmcalidet.priors import save_prior
from mmcalidet.priors.prior import Prior
from testing import build_detector, data_root, get_config, random_prior
from testing._utils import run_tool_in_process

ROOT = Path(__file__).resolve().parents[2]
K = 80
CLASSES = list(CocoDataset.METAINFO['classes'])
IMAGE = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                 '000000005001.jpg')

#: resolvers that give a prior's matrix without its support
MATRIX_ONLY = re.compile(
    r'\b(resolve_prior|resolve_support|load_prior_source|load_prior)\s*\(')
#: tools that read priors as matrices to compare or count them: they
#: build no model and feed no graph (checked below)
MATRIX_TOOLS = {
    'tools/analysis_tools/compare_priors.py',
    'tools/misc/relation_stats_demo.py',
    'projects/context_shift/tools/prior_signal.py',
}
#: what feeding a model or a graph takes
FEEDS = re.compile(r'\b(OnnxDetector|init_detector|inference_detector|'
                   r'CaliDetInferencer|set_prior|MODELS\.build|Runner)\b')


def tool_files():
    for folder in ('tools', 'benchmarks'):
        yield from sorted((ROOT / folder).rglob('*.py'))
    yield from sorted(ROOT.glob('projects/*/tools/**/*.py'))


def test_no_tool_takes_the_matrix_only_path():
    offenders = []
    for path in tool_files():
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if MATRIX_ONLY.search(text) and name not in MATRIX_TOOLS:
            offenders.append(name)
    assert not offenders, (
        'resolve priors with Prior.load / OnnxDetector.as_prior (the '
        f'support travels), not a matrix-only resolver: {offenders}')
    for name in MATRIX_TOOLS:
        text = (ROOT / name).read_text()
        assert not FEEDS.search(text), \
            f'{name} feeds a model: it must resolve through Prior'


def test_the_demo_resolves_through_prior():
    text = (ROOT / 'tools/deployment/onnx_demo.py').read_text()
    assert 'as_prior(args.prior)' in text
    # the library's callers of a matrix-only resolver are its definitions
    for path in sorted((ROOT / 'mmcalidet').rglob('*.py')):
        for line in path.read_text().splitlines():
            if re.search(r'\.(resolve_prior|resolve_support)\(', line):
                pytest.fail(f'{path.relative_to(ROOT)}: {line.strip()}')


@pytest.fixture(scope='module')
def support_graph(tmp_path_factory):
    """(onnx file, a prior file recording its support): a tiny CaliDINO
    whose CaliFormer reads the support, exported at 64 x 64."""
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model = build_detector(
        'calidet/calidet_dino_tiny_coco-mini.py',
        seed=0,
        bbox_head=dict(
            cfg.model.bbox_head,
            califormer=dict(
                cfg.model.bbox_head.califormer,
                support_features=True,
                lift_bias=True,
                zero_init_output=False))).eval()
    former = model.bbox_head.califormer
    with torch.no_grad():  # the zero-initialised branches, made to matter
        former.support_proj.weight.normal_(std=1.0)
        former.lift_scale.fill_(2.0)
    folder = tmp_path_factory.mktemp('runtime_prior')
    site = str(folder / 'site.json')
    save_prior(
        site,
        random_prior(7, K),
        CLASSES,
        num_images=32,
        images_per_class={
            c: i % 9
            for i, c in enumerate(CLASSES)
        })
    out = export_onnx(model, str(folder / 'support.onnx'), (64, 64))
    return out, site


def demo_preds(onnx_file, out_dir, *args):
    res = run_tool_in_process('tools/deployment/onnx_demo.py', IMAGE,
                              onnx_file, '--out-dir', str(out_dir), *args)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(osp.join(out_dir, 'preds', '000000005001.json')) as f:
        return json.load(f), res.stdout


def test_the_demo_keeps_the_support_of_a_prior_file(support_graph, tmp_path):
    out, site = support_graph
    detector = OnnxDetector(out)
    assert detector.support_input
    want = detector(IMAGE, prior=site)
    bare = detector(IMAGE, prior=Prior.load(site).without_support())
    assert not np.allclose(want['scores'], bare['scores'], atol=1e-4), \
        'the support reaches the scores'
    got, _ = demo_preds(out, tmp_path / 'site', '--prior', site)
    np.testing.assert_allclose(got['scores'], want['scores'], atol=1e-5)
    np.testing.assert_allclose(got['bboxes'], want['bboxes'], atol=1e-3)
    # no --prior: the stored E_t with its stored support
    default, _ = demo_preds(out, tmp_path / 'default')
    stored = detector(IMAGE)
    assert detector.as_prior(None).has_support
    np.testing.assert_allclose(default['scores'], stored['scores'], atol=1e-5)
    # --compare-prior resolves the same way, and says what it compared
    _, stdout = demo_preds(out, tmp_path / 'compare', '--prior', site,
                           '--compare-prior', site, '--score-thr', '0.005')
    assert 'detections >= 0.005' in stdout
    assert 'under --compare-prior: same' in stdout
