# Copyright (c) mmcalidet contributors. All rights reserved.
"""The support-aware prior candidate (issue 49) trains with tools/train.py
on a random DINO's cached decoder outputs of generated scenes."""
import os.path as osp

from mmengine.runner import save_checkpoint

from mmcalidet.testing import build_detector, run_tool
from projects.context_shift.context_shift.data import make_context_shift

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def test_the_support_recipe_trains_with_tools_train(tmp_path, monkeypatch):
    data = str(tmp_path / 'context_shift')
    make_context_shift(
        data,
        seed=0,
        num_train=8,
        num_val_per_site=2,
        img_size=64,
        digit_size=(10, 16),
        progress=False)
    monkeypatch.setenv('MMCALIDET_CS_DATA', data)
    dino = build_detector(
        osp.join(ROOT, 'projects', 'context_shift', 'configs',
                 'dino_tiny_context-shift.py'),
        seed=0)
    dino_file = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    work_dir = tmp_path / 'support'
    proc = run_tool(
        'tools/train.py',
        'projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift_cached_support.py',
        '--work-dir',
        str(work_dir),
        '--cfg-options',
        f'load_from={dino_file}',
        f'train_dataloader.dataset.cache_dir={tmp_path}/cache',
        'train_dataloader.dataset.source.progress=False',
        # every step a simulated site with its support
        'model.data_preprocessor.batch_augments.0.mode_probs.sample=0',
        'model.data_preprocessor.batch_augments.0.mode_probs.batch=0',
        'model.data_preprocessor.batch_augments.0.mode_probs.dataset=0',
        'train_cfg.max_iters=3',
        'train_cfg.val_interval=1000',
        'train_cfg.val_begin=1000',
        'default_hooks.checkpoint.interval=3',
        'default_hooks.logger.interval=1',
        'randomness.seed=0',
        threads=1)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    with open(next(work_dir.glob('*/*.log'))) as f:
        log = f.read()
    assert 'Iter(train) [3/3]' in log and 'loss_loma' in log
    assert osp.isfile(work_dir / 'iter_3.pth')
