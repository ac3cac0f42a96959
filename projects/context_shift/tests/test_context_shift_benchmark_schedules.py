# Copyright (c) mmcalidet contributors. All rights reserved.
"""projects/context_shift/tools/benchmark.py's schedules of the two
trainings (checked before anything runs; the CaliDINO from scratch beside
the DINO, or from an earlier DINO checkpoint), on a tiny generated set.
Apart from test_context_shift_benchmark.py (whose trained folder these do
not need), so that a second test worker can run them at the same time."""
import os.path as osp

import pytest

from testing import PROJECT_ROOT, run_tool_in_process

pytestmark = pytest.mark.slow

TOOL = osp.join('projects', 'context_shift', 'tools', 'benchmark.py')


@pytest.fixture(scope='module')
def data(tiny_bench_data) -> str:
    """The tiny benchmark data (conftest's ``tiny_bench_data``)."""
    return tiny_bench_data


def test_benchmark_rejects_a_bad_schedule(tmp_path, capsys, benchmark_tool):
    # through the command line: exit status and a one-line error
    res = run_tool_in_process(
        TOOL,
        '--data',
        str(tmp_path / 'd'),
        '--calidet-init',
        'same-budget',
        '--dino-iters',
        '5',
        '--finetune-iters',
        '2')
    assert res.returncode != 0
    assert 'must divide --dino-iters' in res.stdout + res.stderr
    assert not osp.exists(tmp_path / 'd')  # checked before generating
    # a calibrator config that is missing, or without the cached path;
    # argparse's own errors (exit 2); in this process, as they all fail
    # before any work starts
    tool = benchmark_tool
    this_file = osp.join(PROJECT_ROOT, TOOL)
    cases = [(['--calibrator-config', 'no/such.py'], 'no/such.py: not a file'),
             (['--calibrator-config', this_file, '--calidet-init',
               'finetune'], 'only with --calidet-init cached')]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            tool.main(['--data', str(tmp_path / 'd')] + extra)
        assert not osp.exists(tmp_path / 'd')
    for extra, message in ((['--score-thr',
                             '1.5'], 'a number in [0, 1], got \'1.5\''),
                           (['--score-thr',
                             'nan'], 'a number in [0, 1], got \'nan\'')):
        with pytest.raises(SystemExit) as exc:
            tool.main(['--data', str(tmp_path / 'd')] + extra)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
        assert not osp.exists(tmp_path / 'd')


def test_benchmark_trains_both_from_scratch_side_by_side(
        data, tmp_path, run_benchmark):
    work = tmp_path / 'work'
    code, log = run_benchmark([
        '--data', data, '--work-dir',
        str(work), '--calidet-init', 'scratch', '--dino-iters', '2',
        '--finetune-iters', '1', '--train-only', '--no-progress'
    ])
    assert code == 0, log[-3000:]
    # the same schedule for both, the CaliDINO from no checkpoint
    assert osp.isfile(work / 'dino' / 'iter_2.pth')
    assert osp.isfile(work / 'calidet' / 'iter_2.pth')
    train_log = (work / 'calidet' / 'train.log').read_text()
    assert 'load_from=None' in train_log
    assert 'Load checkpoint from' not in train_log
    # the trainings' own output went to their logs, not the terminal
    assert 'Iter(train)' not in log


def test_benchmark_same_budget_starts_from_an_earlier_checkpoint(
        data, tmp_path, run_benchmark):
    work = tmp_path / 'work'
    code, log = run_benchmark([
        '--data', data, '--work-dir',
        str(work), '--calidet-init', 'same-budget', '--dino-iters', '2',
        '--finetune-iters', '1', '--decay-at', '1', '--train-only',
        '--no-progress'
    ])
    assert code == 0, log[-3000:]
    # the DINO keeps its iteration-1 checkpoint; the CaliDINO runs the
    # remaining iteration from it
    assert osp.isfile(work / 'dino' / 'iter_1.pth')
    assert osp.isfile(work / 'calidet' / 'iter_1.pth')
    assert 'load_from=' + str(work / 'dino' / 'iter_1.pth') in (
        work / 'calidet' / 'train.log').read_text()
