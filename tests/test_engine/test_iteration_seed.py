# Copyright (c) mmcalidet contributors. All rights reserved.
"""IterationSeedHook: a resumed run repeats the uninterrupted one, with and
without data loader workers, in mmengine's iteration-based loop (with
workers), the CPU configs' PromptIterBasedTrainLoop (without) and an
epoch-based one, on a toy model whose data pipeline and forward both draw
from the global generators (fast; the tiny CaliDINO
killed and resumed is tests/test_tools/test_dist_and_resume.py)."""
import random
import uuid

import numpy as np
import pytest
import torch
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmcalidet.engine import IterationSeedHook, PromptIterBasedTrainLoop
from testing.toy_training import NoisyModel

pytestmark = pytest.mark.slow


class RandomAugmentDataset(Dataset):
    """Six samples, each "augmented" with draws from ``random``, numpy and
    torch, as mmcv's transforms draw from numpy's global generator."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> dict:
        return dict(
            inputs=torch.tensor([
                index,
                np.random.rand(),
                random.random(),
                float(torch.rand(()))
            ]))


def train(work_dir,
          loop,
          length,
          num_workers,
          resume=False,
          seed=7,
          sampler='DefaultSampler'):
    """Train 3 iterations (or epochs of 3 iterations) from scratch, or to
    ``length`` after resuming; returns the model."""
    model = NoisyModel()
    by_epoch = loop == 'epoch'
    train_cfg = dict(by_epoch=True, max_epochs=length) if by_epoch else \
        dict(by_epoch=False, max_iters=length)
    if loop == 'prompt':  # the CPU configs' loop (no sleep at a restart)
        train_cfg = dict(type=PromptIterBasedTrainLoop, max_iters=length)
    runner = Runner(
        model=model,
        work_dir=str(work_dir),
        experiment_name=f'seed-{uuid.uuid4().hex}',
        train_dataloader=dict(
            dataset=RandomAugmentDataset(),
            sampler=dict(type=sampler, shuffle=True),
            batch_size=2,
            num_workers=num_workers,
            collate_fn=dict(type='default_collate')),
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook', interval=1, by_epoch=by_epoch),
            logger=None),
        custom_hooks=[IterationSeedHook()],
        randomness=dict(seed=seed),
        resume=resume,
        default_scope='mmengine')
    runner.train()
    end_loader_workers(runner)
    return model


def end_loader_workers(runner) -> None:
    """End the data loader's worker processes with the run: an iterator
    that the garbage collector ends later waits 5 s for each (torch's
    ``MP_STATUS_CHECK_INTERVAL``), 15 s of a test's three runs."""
    fetches = getattr(runner.train_loop, 'dataloader_iterator', None)
    loader_iter = getattr(getattr(fetches, '_iterator', None), '_iterator',
                          None)
    if hasattr(loader_iter, '_shutdown_workers'):
        loader_iter._shutdown_workers()


def resumed_and_whole(tmp_path, loop, num_workers):
    # iterations: 6 in all, resumed after 3; epochs (3 iterations): 2, 1
    whole_length, first = (2, 1) if loop == 'epoch' else (6, 3)
    whole = train(tmp_path / 'whole', loop, whole_length, num_workers)
    train(tmp_path / 'killed', loop, first, num_workers)
    resumed = train(
        tmp_path / 'killed', loop, whole_length, num_workers, resume=True)
    return resumed, whole


@pytest.mark.parametrize('loop,num_workers', [('prompt', 0), ('iter', 1),
                                              ('epoch', 0)])
def test_resume_repeats_the_uninterrupted_run(tmp_path, loop, num_workers):
    resumed, whole = resumed_and_whole(tmp_path, loop, num_workers)
    assert len(whole.records) == 6 and len(resumed.records) == 3
    for (inputs, noise), (want_inputs,
                          want_noise) in zip(resumed.records,
                                             whole.records[3:]):
        assert torch.equal(inputs, want_inputs)  # sample and augmentation
        assert torch.equal(noise, want_noise)  # the model's own draws
    assert torch.equal(resumed.weight, whole.weight)


def test_without_seeded_fetches_a_resume_augments_differently(
        tmp_path, monkeypatch):
    # the hook without its fetch seeding (iteration seeds only): with the
    # pipeline in this process, the batches after the resume differ
    monkeypatch.setattr(IterationSeedHook, 'before_train',
                        lambda self, runner: None)
    resumed, whole = resumed_and_whole(tmp_path, 'prompt', 0)
    indices = [r[0][:, 0] for r in resumed.records]
    assert all(
        torch.equal(a, b[0][:, 0])
        for a, b in zip(indices, whole.records[3:]))  # the same samples
    assert not torch.equal(resumed.records[0][0], whole.records[3][0])
    assert all(
        torch.equal(a[1], b[1])
        for a, b in zip(resumed.records, whole.records[3:]))


def train_from_config(work_dir, length, resume=False):
    """The toy run through a config without ``randomness.seed`` (as the
    documented commands run), resumed the way tools/train.py does: the
    interrupted run's seed restored before the runner is built."""
    from mmengine.config import Config

    from mmcalidet.engine import restore_run_seed
    model = NoisyModel()
    cfg = Config(
        dict(
            work_dir=str(work_dir),
            train_cfg=dict(by_epoch=False, max_iters=length),
            randomness=dict(seed=None),
            resume=resume))
    restored = restore_run_seed(cfg)
    runner = Runner(
        model=model,
        work_dir=cfg.work_dir,
        experiment_name=f'seed-{uuid.uuid4().hex}',
        train_dataloader=dict(
            dataset=RandomAugmentDataset(),
            sampler=dict(type='InfiniteSampler', shuffle=True),
            batch_size=2,
            num_workers=0,
            collate_fn=dict(type='default_collate')),
        train_cfg=cfg.train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False),
            logger=None),
        custom_hooks=[IterationSeedHook()],
        randomness=cfg.randomness,
        resume=cfg.resume,
        default_scope='mmengine')
    runner.train()
    return model, runner.seed, restored


def test_resume_without_a_seed_repeats_the_interrupted_run(tmp_path):
    # the interrupted run draws its seed; the resumed one restores it from
    # the checkpoint before the sampler is built (its shuffle order too)
    killed, seed, restored = train_from_config(tmp_path / 'killed', 3)
    assert restored is None  # nothing to restore in a fresh run
    resumed, resumed_seed, restored = train_from_config(
        tmp_path / 'killed', 6, resume=True)
    assert restored == seed == resumed_seed
    # the uninterrupted run of that seed
    whole = train(
        tmp_path / 'whole', 'iter', 6, 0, seed=seed, sampler='InfiniteSampler')
    assert len(resumed.records) == 3
    for (inputs, noise), (want_inputs,
                          want_noise) in zip(resumed.records,
                                             whole.records[3:]):
        assert torch.equal(inputs, want_inputs)
        assert torch.equal(noise, want_noise)
    assert torch.equal(resumed.weight, whole.weight)
    # an explicit seed is the config's to keep
    from mmengine.config import Config

    from mmcalidet.engine import restore_run_seed
    cfg = Config(
        dict(
            work_dir=str(tmp_path / 'killed'),
            randomness=dict(seed=seed + 1),
            resume=True))
    assert restore_run_seed(cfg) is None and cfg.randomness.seed == seed + 1
