# Copyright (c) mmcalidet contributors. All rights reserved.
"""PromptIterBasedTrainLoop: mmengine's iteration-based loop, its data
loader restarted without the 2 s sleep where it has no workers; the same
batches, order and random draws as the parent's."""
import uuid

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import IterBasedTrainLoop, Runner
from mmengine.runner import loops as mmengine_loops
from torch.utils.data import Dataset

from mmcalidet.engine.iter_train_loop import (PromptIterBasedTrainLoop,
                                              _PromptRestarts)
from testing import PROJECT_ROOT
from testing.toy_training import NoisyModel


class Drawing(Dataset):
    """Five samples (two passes of batch 2 end on a short batch), each
    with a draw from numpy's generator, as an augmentation draws."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        return dict(inputs=torch.tensor([index, np.random.rand()]))


def train(work_dir, loop: str, num_workers: int = 0, iters: int = 8):
    """Train ``iters`` iterations (more than two passes) from a seed."""
    model = NoisyModel(width=2)
    runner = Runner(
        model=model,
        work_dir=str(work_dir),
        experiment_name=f'loop-{uuid.uuid4().hex}',
        train_dataloader=dict(
            dataset=Drawing(),
            sampler=dict(type='DefaultSampler', shuffle=True),
            batch_size=2,
            num_workers=num_workers,
            collate_fn=dict(type='default_collate')),
        train_cfg=dict(type=loop, max_iters=iters),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=None, logger=None),
        randomness=dict(seed=3),
        default_scope='mmdet')
    runner.train()
    return model, runner


@pytest.fixture
def sleeps(monkeypatch):
    """The seconds mmengine's loops asked to sleep (none slept)."""
    asked = []
    monkeypatch.setattr(mmengine_loops.time, 'sleep', asked.append)
    return asked


def test_the_same_run_without_the_sleep(tmp_path, sleeps):
    parent, _ = train(tmp_path / 'parent', 'IterBasedTrainLoop')
    assert sleeps == [2, 2]  # two restarts of the parent's loader
    sleeps.clear()
    prompt, runner = train(tmp_path / 'prompt', 'PromptIterBasedTrainLoop')
    assert sleeps == []
    assert isinstance(runner.train_loop, PromptIterBasedTrainLoop)
    assert isinstance(runner.train_loop.dataloader_iterator, _PromptRestarts)
    # every batch (shuffled anew each pass), short batches included, and
    # every draw of the pipeline and the model: the parent's
    assert len(prompt.records) == len(parent.records) == 8
    assert [len(b) for b, _ in prompt.records] == [2, 2, 1, 2, 2, 1, 2, 2]
    for (inputs, noise), (want_inputs, want_noise) in zip(
            prompt.records, parent.records):
        assert torch.equal(inputs, want_inputs)
        assert torch.equal(noise, want_noise)
    assert torch.equal(prompt.weight, parent.weight)
    orders = [b[:, 0].tolist() for b, _ in prompt.records]
    assert sorted(sum(orders[:3], [])) == [0, 1, 2, 3, 4]  # one pass
    assert orders[:3] != orders[3:6]  # reshuffled at the restart


def test_a_loader_with_workers_keeps_the_parents_wait(tmp_path, sleeps):
    _, runner = train(
        tmp_path / 'workers', 'PromptIterBasedTrainLoop', num_workers=1,
        iters=4)
    assert not isinstance(runner.train_loop.dataloader_iterator,
                          _PromptRestarts)
    assert isinstance(runner.train_loop, IterBasedTrainLoop)
    assert sleeps == [2]  # the parent's restart


@pytest.mark.parametrize('config', [
    'configs/calidet/calidet_dino_tiny_coco-mini.py',
    'configs/calidet/calidet_dino_tiny_coco-mini_cached.py',
    'configs/calidet/calidet_faster-rcnn_tiny_coco-mini.py',
    'projects/context_shift/configs/dino_tiny_context-shift.py',
    'projects/context_shift/configs/'
    'calidet_dino_tiny_context-shift_cached_support.py',
])
def test_the_cpu_configs_train_with_it(config, monkeypatch, tmp_path):
    monkeypatch.setenv('MMCALIDET_CS_DATA', str(tmp_path))
    cfg = Config.fromfile(f'{PROJECT_ROOT}/{config}')
    assert cfg.train_cfg.type == 'PromptIterBasedTrainLoop'
    assert cfg.train_dataloader.num_workers == 0
