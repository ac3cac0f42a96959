# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/deployment/: export_onnx.py (--verify, --fold-prior, bad priors)
and onnx_demo.py, as a user runs them."""
import json
import os.path as osp

import pytest
from mmengine.runner import save_checkpoint

from mmcalidet.deploy import read_export_meta
from testing import build_detector, data_root, run_tool

pytestmark = pytest.mark.slow

CONFIG = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
IMAGE = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                 '000000000139.jpg')


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    model = build_detector('calidet/calidet_dino_tiny_coco-mini.py', seed=0)
    path = str(tmp_path_factory.mktemp('ckpt') / 'calidino.pth')
    save_checkpoint(dict(state_dict=model.state_dict()), path)
    return path


def test_export_verifies_and_the_demo_draws_two_priors(checkpoint, tmp_path):
    out = str(tmp_path / 'calidino.onnx')
    res = run_tool('tools/deployment/export_onnx.py', CONFIG, checkpoint,
                   '--out', out, '--verify')
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'verified: ONNX Runtime agrees with PyTorch' in res.stdout
    assert 'no box: True' in res.stdout
    meta = read_export_meta(out)
    assert meta['input_shape'] == [256, 256]  # the config's test scale
    demo = tmp_path / 'demo'
    res = run_tool('tools/deployment/onnx_demo.py', IMAGE, out, '--prior',
                   'coco2017_val', '--compare-prior', 'coco2017_train',
                   '--out-dir', str(demo), '--score-thr', '0.05')
    assert res.returncode == 0, res.stderr[-3000:]
    assert '000000000139.jpg: ' in res.stdout
    for sub in ('vis/000000000139.jpg', 'preds/000000000139.json',
                'compare/000000000139.png'):
        assert osp.isfile(demo / sub), sub
    with open(demo / 'preds' / '000000000139.json') as f:
        pred = json.load(f)
    assert len(pred['bboxes']) == len(pred['scores']) == len(
        pred['label_names']) > 0


def test_a_folded_export_and_a_bad_prior_that_writes_nothing(
        checkpoint, tmp_path):
    out = str(tmp_path / 'folded.onnx')
    res = run_tool('tools/deployment/export_onnx.py', CONFIG, checkpoint,
                   '--out', out, '--fold-prior', 'coco2017_val', '--shape',
                   '192', '256')
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'prior coco2017_val folded' in res.stdout
    meta = read_export_meta(out)
    assert meta['prior_input'] is False and meta['folded'] is True
    assert meta['input_shape'] == [192, 256]
    bad = str(tmp_path / 'bad.onnx')
    res = run_tool('tools/deployment/export_onnx.py', CONFIG, checkpoint,
                   '--out', bad, '--fold-prior', 'no_such_prior')
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith('export_onnx.py: error: ') and \
        'no_such_prior' in last, last
    assert not osp.exists(bad)
    # the demo refuses a run-time prior for a folded export, before running
    res = run_tool('tools/deployment/onnx_demo.py', IMAGE, out, '--prior',
                   'coco2017_train', '--out-dir', str(tmp_path / 'demo'))
    assert res.returncode == 1 and 'folded' in res.stderr.splitlines()[-1]
    assert not osp.exists(tmp_path / 'demo')
