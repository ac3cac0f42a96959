# Copyright (c) mmcalidet contributors. All rights reserved.
"""The project's tests run from the repository root (``python -m pytest``
puts it on ``sys.path``); the tools they start find the project through
``PYTHONPATH``, as a user's shell does."""
import os
import os.path as osp

import pytest

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
os.environ['PYTHONPATH'] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
              if p])


@pytest.fixture
def run_tool():
    """:func:`mmcalidet.testing.run_tool`: a script under this Python, its
    output captured."""
    from mmcalidet.testing import run_tool as run
    return run


@pytest.fixture
def train_recipe(tmp_path, monkeypatch):
    """Train a calibrator recipe of the project as a user runs it:
    ``tools/train.py CONFIG`` for 3 steps on a random DINO's cached decoder
    outputs of 8 generated scenes. Call it with the config's file name, the
    key of its ``DecoderCacheDataset`` under ``train_dataloader`` and more
    ``--cfg-options``; it asserts the run's success and returns its log."""
    from mmengine.runner import save_checkpoint

    from mmcalidet.testing import build_detector
    from mmcalidet.testing import run_tool as run
    from projects.context_shift.context_shift.data import make_context_shift
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
