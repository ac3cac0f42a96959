# Copyright (c) mmcalidet contributors. All rights reserved.
""":class:`IterationSeedHook`: mmengine seeds the random generators once
per run and does not save their states, so a resumed run draws other
numbers than the uninterrupted one (the data pipeline's augmentation
without loader workers, the EdgeSampler's modes and noise, DINO's
denoising queries, dropout). Seeding every batch fetch and every
iteration from ``(run seed, iteration)`` makes a resumed run repeat
it.

A config registers it by importing ``mmcalidet.engine.checkpoint_hooks``
(see there) and uses it with::

    custom_hooks = [dict(type='IterationSeedHook')]
"""
import random
from typing import Optional

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook


def iteration_seed(seed: int, iteration: int, stream: int = 0) -> int:
    """A 32-bit seed mixed from a run seed and an iteration (numpy's
    ``SeedSequence``: nearby inputs give unrelated streams).

    Args:
        seed (int): the run's seed (``runner.seed``).
        iteration (int): the iteration about to run.
        stream (int): 0 for the iteration itself, 1 for fetching its batch
            (another stream of numbers for the same iteration).

    Returns:
        int: the seed, in [0, 2**32).
    """
    entropy = [int(seed) % 2**32, int(iteration)]
    if stream:
        entropy.append(int(stream))
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy's global generator and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


#: ``iteration_seed`` stream of the batch fetches
FETCH_STREAM = 1


class _SeededFetches:
    """An iterator over training batches that seeds the generators of
    this process before fetching each one, from the run's seed and the
    iteration the batch is for (``runner.iter``).

    Without data loader workers the data pipeline (e.g. ``RandomFlip``)
    runs in ``next()``, in this process: each batch is then augmented the
    same whatever ran before (on resume: the batches the loop skips).

    Args:
        iterator: the loop's batch iterator (mmengine's
            ``_InfiniteDataloaderIterator``); other attributes are its.
        runner (Runner): the runner.
    """

    def __init__(self, iterator, runner) -> None:
        self._iterator = iterator
        self._runner = runner

    def __iter__(self) -> '_SeededFetches':
        return self

    def __next__(self):
        seed_everything(
            iteration_seed(self._runner.seed, self._runner.iter, FETCH_STREAM))
        return next(self._iterator)

    def __getattr__(self, name: str):
        return getattr(self._iterator, name)


@HOOKS.register_module()
class IterationSeedHook(Hook):
    """Seed ``random``, numpy and torch from the run's seed
    (``randomness.seed``, restored from the checkpoint on resume) and the
    iteration: before every training iteration, and before the batch of
    every iteration is fetched.

    A run resumed from the checkpoint of iteration N then fetches and runs
    iteration N + 1 with the random numbers of the uninterrupted run,
    whatever ran before (earlier iterations, validation, the batches the
    loop skips to reach N + 1), so on CPU its final weights are
    bit-identical, with data loader workers or without:

    - iteration-based loops (mmengine's ``IterBasedTrainLoop``, the tiny
      configs'): the loop's batch iterator is wrapped so that the
      generators are seeded right before each batch is fetched. With
      ``num_workers=0`` the data pipeline's augmentation (e.g.
      ``RandomFlip``) runs then, in this process; workers
      (``num_workers >= 1``) are seeded by mmengine from the run seed and
      repeat in any case.
    - epoch-based loops (which mmengine resumes at the start of an epoch):
      the generators are seeded at the start of every epoch, so the
      epoch's batches repeat.

    After the fetch, ``before_train_iter`` seeds again (another stream):
    the model's randomness (the EdgeSampler, denoising queries, dropout)
    does not depend on how much the pipeline drew. ``randomness.
    diff_rank_seed`` keeps its meaning (``runner.seed`` then differs by
    rank).
    """

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        """Wrap an iteration-based loop's batch iterator (see the class).

        Args:
            runner (Runner): the runner.
        """
        loop = runner.train_loop
        iterator = getattr(loop, 'dataloader_iterator', None)
        if iterator is not None and not isinstance(iterator, _SeededFetches):
            loop.dataloader_iterator = _SeededFetches(iterator, runner)

    def before_train_epoch(self, runner) -> None:
        """Seed the fetch of the epoch's first batch (what an epoch-based
        loop fetches next; an iteration-based loop reseeds at each fetch).

        Args:
            runner (Runner): the runner.
        """
        seed_everything(iteration_seed(runner.seed, runner.iter, FETCH_STREAM))

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: Optional[dict] = None) -> None:
        """Seed the generators for iteration ``runner.iter``.

        Args:
            runner (Runner): the runner.
            batch_idx (int): index of the batch in the epoch.
            data_batch (dict, optional): the batch.
        """
        seed_everything(iteration_seed(runner.seed, runner.iter))
