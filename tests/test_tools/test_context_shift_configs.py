# Copyright (c) mmcalidet contributors. All rights reserved.
"""configs/context_shift/: both twins train on generated data."""
import os
import os.path as osp
import subprocess
import sys

import pytest

from mmcalidet.datasets.context_shift import make_context_shift

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture(scope='module')
def cs_data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('cs') / 'context_shift')
    make_context_shift(out, seed=0, num_train=8, num_val_per_site=2,
                       img_size=64, digit_size=(10, 16), progress=False)
    return out


@pytest.mark.parametrize('config', [
    'configs/context_shift/dino_tiny_context-shift.py',
    'configs/context_shift/calidet_dino_tiny_context-shift.py'
])
def test_twins_train_two_iterations(cs_data, tmp_path, config):
    env = dict(os.environ, MMCALIDET_CS_DATA=cs_data)
    env.pop('MMCALIDET_LIGHT', None)
    res = subprocess.run([
        sys.executable, 'tools/train.py', config, '--work-dir',
        str(tmp_path), '--cfg-options', 'train_cfg.max_iters=2',
        'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2',
        'load_from=None',
        'default_hooks.logger.interval=1'
    ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert 'Iter(train) [2/2]' in log
    assert osp.isfile(tmp_path / 'iter_2.pth')
    if 'calidet' in config:
        assert 'loss_loma' in log
