# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/calibrator_curve.py on the tiny coco-mini models:
one training with snapshots, each evaluated on the DINO's cache."""
import json
import os.path as osp
import runpy

from mmengine.runner import save_checkpoint

from mmcalidet.testing import PROJECT_ROOT, build_detector, run_tool

TOOL = 'tools/analysis_tools/calibrator_curve.py'
CACHED = 'configs/calidet/calidet_dino_tiny_coco-mini_cached.py'
DINO = 'configs/calidet/dino_tiny_coco-mini.py'


def run(args):
    proc = run_tool(TOOL, *args, threads=1)
    return proc.returncode, proc.stdout + proc.stderr


def test_curve_trains_once_and_evaluates_every_snapshot(
        tmp_path, capsys, monkeypatch):
    dino = build_detector('calidet/dino_tiny_coco-mini.py', seed=0)
    ckpt = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), ckpt)
    work = str(tmp_path / 'curve')
    args = [
        CACHED, '--dino-config', DINO, '--dino-checkpoint', ckpt,
        '--updates', '2', '1', '--work-dir', work, '--cache-dir',
        str(tmp_path / 'cache'), '--max-images', '4', '--no-progress',
        '--cfg-options', 'train_dataloader.dataset.source.indices=[0,1,2]',
        'train_dataloader.dataset.source.progress=False'
    ]
    code, out = run(args)
    assert code == 0, out[-4000:]
    for n in (1, 2):
        assert osp.isfile(osp.join(work, f'snapshot_iter_{n}.pth'))
    with open(osp.join(work, 'results', 'curve.json')) as f:
        result = json.load(f)
    points = result['points']
    assert [p['updates'] for p in points] == [1, 2]
    for p in points:
        # the summary is the table's arithmetic
        assert abs(p['spread'] - (p['AP_E_x'] - p['AP_flip_E_x'])) < 1e-9
        assert abs(p['gain'] - (p['AP_E_x'] - p['AP_E0'])) < 1e-9
        assert abs(p['et_vs_dino'] -
                   (p['AP_E_t'] - result['reference']['AP_dino'])) < 1e-9
    assert osp.getsize(osp.join(work, 'results', 'curve.png')) > 0
    assert '| 1 |' in out and '| 2 |' in out
    # the same settings again: the training is reused, not repeated
    tool = runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')
    parsed = tool['parse_args'](args)
    tool['write_config'](parsed, [1, 2])
    assert 'reusing the snapshots' in capsys.readouterr().out
    # another option: trained again (here only the decision is checked)
    parsed.cfg_options = parsed.cfg_options + ['model.bbox_head.rho=0.5']
    monkeypatch.setattr(tool['subprocess'], 'run',
                        lambda *a, **k: trained.append(a[0]))
    trained = []
    tool['write_config'](parsed, [1, 2])
    assert trained and 'model.bbox_head.rho=0.5' in trained[0]


def test_missing_files_are_one_line_errors(tmp_path):
    code, out = run([
        CACHED, '--dino-config', DINO, '--dino-checkpoint',
        str(tmp_path / 'none.pth'), '--updates', '1', '--work-dir',
        str(tmp_path)
    ])
    assert code == 1 and 'not found' in out and 'Traceback' not in out
