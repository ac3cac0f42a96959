# Copyright (c) mmcalidet contributors. All rights reserved.
"""projects/context_shift/experiments/calibrator_curve.py on the tiny coco-mini
models: one training with snapshots, each evaluated on the DINO's cache."""
import json
import os.path as osp
import runpy
from types import SimpleNamespace

import pytest
from mmengine.runner import save_checkpoint

from projects.context_shift.context_shift import training
from testing import (PROJECT_ROOT, build_detector, logging_restored,
                     run_tool_in_process)

TOOL = 'projects/context_shift/experiments/calibrator_curve.py'
CACHED = 'configs/calidet/calidet_dino_tiny_coco-mini_cached.py'
DINO = 'configs/calidet/dino_tiny_coco-mini.py'


def run(args):
    """The tool's command line in this process (its evaluation of the
    snapshots); its training a ``tools/train.py`` process forked from the
    tool server (conftest's ``_trainings_forked``)."""
    with logging_restored():
        proc = run_tool_in_process(TOOL, *args)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
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
    assert osp.getsize(osp.join(work, 'results', 'curve.png')) > 0
    assert '| 1 |' in out and '| 2 |' in out
    # the same settings again: the training is reused, not repeated
    tool = runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')
    parsed = tool['parse_args'](args)
    tool['write_config'](parsed, [1, 2])
    assert '[train] reusing' in capsys.readouterr().out
    # another option: trained again (here only the decision is checked)
    parsed.cfg_options = parsed.cfg_options + ['model.bbox_head.rho=0.5']
    trained = []

    class Recorded:

        def __init__(self, cmd, **kwargs):
            trained.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(training, 'launch', Recorded)
    parsed.no_progress = True
    tool['write_config'](parsed, [1, 2])
    assert trained and 'model.bbox_head.rho=0.5' in trained[0]


def test_summary_figures_and_order_verdict():
    """Hand-derived figures of two injection tables: one in the expected
    order, one where flip(E_x) beats E0."""
    from mmcalidet.evaluation import protocol
    tool = runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')
    method = SimpleNamespace(name='CaliDINO', takes_prior=True)

    def summarize(aps):
        rows = [dict(method='CaliDINO', key=k, AP=v) for k, v in aps.items()]
        orders = protocol.expected_orders(rows, [method], tool['PRIORS'])
        return tool['summarize'](rows, 0.46, orders['CaliDINO'])

    good = summarize(
        dict(flip_E_x=0.40, E0=0.45, E_t=0.47, E_b=0.50, E_x=0.60))
    assert good['spread'] == pytest.approx(20.0)
    assert good['gain'] == pytest.approx(15.0)
    assert good['flip_drop'] == pytest.approx(5.0)
    assert good['et_vs_dino'] == pytest.approx(1.0)
    assert good['order'].startswith('holds')
    bad = summarize(
        dict(flip_E_x=0.50, E0=0.45, E_t=0.47, E_b=0.50, E_x=0.60))
    assert bad['flip_drop'] == pytest.approx(-5.0)
    assert bad['order'].startswith('does not hold')


@pytest.mark.slow
def test_missing_files_are_one_line_errors(tmp_path):
    proc = run_tool_in_process(TOOL, CACHED, '--dino-config', DINO,
                               '--dino-checkpoint', str(tmp_path / 'none.pth'),
                               '--updates', '1', '--work-dir', str(tmp_path))
    code, out = proc.returncode, proc.stdout + proc.stderr
    assert code == 1 and 'not found' in out and 'Traceback' not in out
