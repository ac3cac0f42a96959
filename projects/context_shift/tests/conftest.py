# Copyright (c) mmcalidet contributors. All rights reserved.
"""The project's tests run from the repository root (``python -m pytest``
puts it on ``sys.path``); the tools they start find the project through
``PYTHONPATH``, as a user's shell does."""
import importlib.util
import os
import os.path as osp
from types import ModuleType
from typing import Callable, List, Tuple

import pytest

from testing.logging_state import logging_restored

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
os.environ['PYTHONPATH'] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
              if p])


@pytest.fixture(scope='module')
def tiny_bench_data(tmp_path_factory) -> str:
    """A tiny benchmark data folder, made once per test module: 8 train
    scenes and 3 val scenes per site, 64 px, digits of 10-16 px, seed 0.
    """
    from projects.context_shift.context_shift import make_context_shift
    path = str(tmp_path_factory.mktemp('bench') / 'data')
    make_context_shift(
        path,
        seed=0,
        num_train=8,
        num_val_per_site=3,
        img_size=64,
        digit_size=(10, 16),
        progress=False)
    return path


@pytest.fixture(autouse=True)
def _trainings_forked(monkeypatch):
    """The benchmark's trainings start as ``tools/train.py`` processes
    forked from the test process's tool server (imports done once) rather
    than as new interpreters (:func:`testing.popen_tool`)."""
    from projects.context_shift.context_shift import training
    from testing import popen_tool
    monkeypatch.setattr(training, 'launch', popen_tool)


@pytest.fixture
def run_tool():
    """:func:`testing.run_tool`: a script under this Python, its
    output captured."""
    from testing import run_tool as run
    return run


@pytest.fixture
def train_recipe(tmp_path, monkeypatch):
    """Train a calibrator recipe of the project as a user runs it:
    ``tools/train.py CONFIG`` for 3 steps on a random DINO's cached decoder
    outputs of 8 generated scenes. Call it with the config's file name, the
    key of its ``DecoderCacheDataset`` under ``train_dataloader`` and more
    ``--cfg-options``; it asserts the run's success and returns its log."""
    from mmengine.runner import save_checkpoint

    from projects.context_shift.context_shift.data import make_context_shift
    from testing import build_detector
    from testing import run_tool as run
    configs = osp.join(ROOT, 'projects', 'context_shift', 'configs')

    def train(config: str, cache_key: str, *options: str) -> str:
        data = str(tmp_path / 'context_shift')
        make_context_shift(data, seed=0, num_train=8, num_val_per_site=2,
                           img_size=64, digit_size=(10, 16), progress=False)
        monkeypatch.setenv('MMCALIDET_CS_DATA', data)
        dino = build_detector(
            osp.join(configs, 'dino_tiny_context-shift.py'), seed=0)
        dino_file = str(tmp_path / 'dino.pth')
        save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
        work_dir = tmp_path / 'recipe'
        proc = run(
            'tools/train.py', osp.join(configs, config), '--work-dir',
            str(work_dir), '--cfg-options', f'load_from={dino_file}',
            f'train_dataloader.{cache_key}.cache_dir={tmp_path}/cache',
            f'train_dataloader.{cache_key}.source.progress=False', *options,
            'train_cfg.max_iters=3', 'train_cfg.val_interval=1000',
            'train_cfg.val_begin=1000', 'default_hooks.checkpoint.interval=3',
            'default_hooks.logger.interval=1', 'randomness.seed=0',
            threads=1)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-5000:]
        assert osp.isfile(work_dir / 'iter_3.pth')
        with open(next(work_dir.glob('*/*.log'))) as f:
            return f.read()

    return train


@pytest.fixture
def benchmark_tool() -> ModuleType:
    """``projects/context_shift/tools/benchmark.py`` loaded as a module."""
    spec = importlib.util.spec_from_file_location(
        'benchmark_tool',
        osp.join(ROOT, 'projects', 'context_shift', 'tools', 'benchmark.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_benchmark(benchmark_tool, capfd,
                  monkeypatch) -> Callable[[List[str]], Tuple[int, str]]:
    """The benchmark's ``main()`` in this process, from the repository root,
    for the tests of what it does rather than of its command line (that is
    :func:`benchmark_command_line`'s): one start-up of torch and mmdet less
    per run. Its trainings are still
    ``tools/train.py`` processes. Call it with the arguments; it returns the
    exit status and what the run printed (its own and its subprocesses'
    output, as a terminal gets it). The logging it sends to its work
    folder and the benchmark data folder it names in the environment are
    given back afterwards."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv('MMCALIDET_CS_DATA', raising=False)

    def run(args: List[str]) -> Tuple[int, str]:
        capfd.readouterr()
        with logging_restored():
            code = benchmark_tool.main(args)
        captured = capfd.readouterr()
        return code, captured.out + captured.err

    return run


@pytest.fixture(scope='session')
def benchmark_command_line() -> Callable[..., Tuple[int, str]]:
    """The benchmark's command line for the module fixtures that share one
    run (``_trainings_forked`` is a test's fixture, set up after them): the
    script as ``__main__`` in this process, from the repository root
    (:func:`testing.run_tool_in_process`), its trainings ``tools/train.py``
    processes forked from the tool server (:func:`testing.popen_tool`: no
    new interpreter's imports). The logging it sends to its work folder and
    the benchmark data folder it names in the environment are given back
    afterwards. Call it with the arguments; it returns the exit status and
    what the run printed."""
    from projects.context_shift.context_shift import training
    from testing import popen_tool, run_tool_in_process
    tool = osp.join('projects', 'context_shift', 'tools', 'benchmark.py')

    def run(*args: str) -> Tuple[int, str]:
        with pytest.MonkeyPatch.context() as patch, logging_restored():
            patch.setattr(training, 'launch', popen_tool)
            patch.delenv('MMCALIDET_CS_DATA', raising=False)
            res = run_tool_in_process(tool, *args, cwd=ROOT)
        return res.returncode, res.stdout + res.stderr

    return run
