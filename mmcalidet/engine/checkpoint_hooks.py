# Copyright (c) mmcalidet contributors. All rights reserved.
"""Hooks for checkpoints that survive a kill and resume exactly.

- :class:`AtomicCheckpointHook` (with :class:`AtomicLocalBackend`):
  mmengine 0.10.7's ``CheckpointHook`` (1) deletes the outdated checkpoint
  (``max_keep_ckpts``), (2) writes the new one in place and (3) rewrites
  ``last_checkpoint`` in place. A kill during (2) leaves a truncated
  ``iter_N.pth`` and, with ``max_keep_ckpts=1``, nothing to resume from; a
  kill during (3) leaves an empty ``last_checkpoint``. Here every file is
  written to a temporary file beside its target and renamed onto it, in
  the order (2), (3), (1): at any instant ``last_checkpoint`` names a
  complete checkpoint.
- :class:`IterationSeedHook`: mmengine seeds the random generators once
  per run and does not save their states, so a resumed run draws other
  numbers than the uninterrupted one (the data pipeline's augmentation
  without loader workers, the EdgeSampler's modes and noise, DINO's
  denoising queries, dropout). Seeding every batch fetch and every
  iteration from ``(run seed, iteration)`` makes a resumed run repeat
  it.
- :class:`CheckpointCompatHook`: says, before mmengine loads a checkpoint,
  what of it does not fit the model (another class count, a plain
  detector's checkpoint in a CaliDet model or the reverse).

Configs use them with (the module is imported explicitly)::

    custom_imports = dict(
        imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
        allow_failed_imports=False)
    default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
    custom_hooks = [dict(type='IterationSeedHook')]
"""
import glob
import logging
import os
import os.path as osp
import random
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio.backends.registry_utils import backends
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper

from ..utils.checkpoint_compat import check_checkpoint
from ..utils.file_io import INCOMPLETE_SUFFIX, atomic_write, incomplete_prefix

#: the name to use in ``backend_args=dict(backend=...)``
ATOMIC_BACKEND = 'local_atomic'


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose writes are atomic.

    ``put`` and ``put_text`` write a temporary file in the target's folder
    and rename it onto the target only once it is complete and flushed to
    disk, so a reader (or a run resumed after a kill) sees the old file or
    the new one, never a truncated one. Registered as ``'local_atomic'``
    for ``backend_args=dict(backend='local_atomic')``.
    """

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        """Write bytes to ``filepath`` atomically.

        Args:
            obj (bytes): data to write.
            filepath (str | Path): the destination (folders are created).
        """
        with atomic_write(filepath, 'wb') as f:
            f.write(obj)

    def put_text(self,
                 obj: str,
                 filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
        """Write text to ``filepath`` atomically.

        Args:
            obj (str): text to write.
            filepath (str | Path): the destination (folders are created).
            encoding (str): the text encoding. Defaults to 'utf-8'.
        """
        with atomic_write(filepath, 'w', encoding=encoding) as f:
            f.write(obj)


if backends.get(ATOMIC_BACKEND) is not AtomicLocalBackend:
    register_backend(ATOMIC_BACKEND, AtomicLocalBackend)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` that never leaves a truncated or missing latest
    checkpoint behind a kill.

    - checkpoints are written through :class:`AtomicLocalBackend` (unless
      ``out_dir`` is a remote URI or ``backend_args`` /
      ``file_client_args`` name another backend);
    - ``last_checkpoint`` is rewritten atomically, after the checkpoint it
      names is complete;
    - outdated checkpoints (``max_keep_ckpts``) are removed only then;
    - temporary files left by a killed run are removed before training.

    Args:
        *args, **kwargs: the arguments of mmengine's ``CheckpointHook``.
    """

    def __init__(self,
                 *args,
                 out_dir: Optional[str] = None,
                 backend_args: Optional[dict] = None,
                 file_client_args: Optional[dict] = None,
                 **kwargs) -> None:
        if backend_args is None and file_client_args is None and \
                (out_dir is None or '://' not in str(out_dir)):
            backend_args = dict(backend=ATOMIC_BACKEND)
        super().__init__(
            *args,
            out_dir=out_dir,
            backend_args=backend_args,
            file_client_args=file_client_args,
            **kwargs)

    def before_train(self, runner) -> None:
        """Set up as ``CheckpointHook``, then remove the temporary files of
        checkpoints whose writing a kill interrupted.

        Args:
            runner (Runner): the runner.
        """
        super().before_train(runner)
        if not is_main_process() or \
                not isinstance(self.file_backend, AtomicLocalBackend):
            return
        # atomic_write names its temporary files
        # <name>.incomplete-<random>.tmp (before: .<name>.<random>.tmp)
        name = glob.escape(self.filename_tmpl).replace('{}', '*')
        out_dir = glob.escape(self.out_dir)
        for path in sorted(
                glob.glob(osp.join(out_dir, f'{incomplete_prefix(name)}*'
                                   f'{INCOMPLETE_SUFFIX}')) +
                glob.glob(osp.join(out_dir, f'.{name}.*.tmp'))):
            runner.logger.warning(
                f'removing {path}, an incomplete checkpoint of an '
                'interrupted run')
            os.remove(path)

    def _save_checkpoint_with_step(self, runner, step: int,
                                   meta: dict) -> None:
        """Save the checkpoint of ``step``, point ``last_checkpoint`` at it,
        then remove the checkpoint ``max_keep_ckpts`` lets go.

        The bookkeeping (``keep_ckpt_ids`` and ``last_ckpt`` in the message
        hub, saved inside the checkpoint) is the parent's; only the order
        of the file operations differs.

        Args:
            runner (Runner): the runner.
            step (int): the epoch or iteration of the checkpoint.
            meta (dict): the checkpoint's meta information.
        """
        outdated = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir,
                                                     ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            ckpt_filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():
            return
        with atomic_write(osp.join(runner.work_dir, 'last_checkpoint')) as f:
            f.write(self.last_ckpt)
        if outdated is not None:
            path = self.file_backend.join_path(
                self.out_dir, self.filename_tmpl.format(outdated))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # deepspeed checkpoints
                self.file_backend.rmtree(path)


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


@HOOKS.register_module()
class CheckpointCompatHook(Hook):
    """Say what of a checkpoint does not fit the model, before mmengine
    loads it (``load_from``, ``--resume``, ``tools/test.py``); see
    :func:`~mmcalidet.utils.checkpoint_compat.check_checkpoint`.

    - tensors of other shapes (e.g. a checkpoint of another class count):
      an error, unless ``allow_shape_mismatch`` (then a warning);
    - a plain detector's checkpoint (e.g. DINO) in a CaliDet model: a
      warning (fine-tuning from a baseline is the paper's recipe), an
      error unless ``allow_uncalibrated``;
    - a CaliDet checkpoint in a plain detector: a warning that the
      calibration is dropped;
    - other missing tensors: a warning, an error unless ``allow_missing``.

    Resuming requires every tensor to fit. ``tools/train.py`` and
    ``tools/test.py`` add this hook (``tools/test.py`` with
    ``allow_uncalibrated=False, allow_missing=False``) unless the config
    has one.

    Args:
        allow_shape_mismatch (bool): Defaults to False.
        allow_uncalibrated (bool): Defaults to True.
        allow_missing (bool): Defaults to True.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 allow_shape_mismatch: bool = False,
                 allow_uncalibrated: bool = True,
                 allow_missing: bool = True) -> None:
        self.allow_shape_mismatch = allow_shape_mismatch
        self.allow_uncalibrated = allow_uncalibrated
        self.allow_missing = allow_missing

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Compare ``checkpoint['state_dict']`` with the model (the runner
        calls this before it loads the weights).

        Args:
            runner (Runner): the runner.
            checkpoint (dict): the loaded checkpoint.

        Raises:
            CheckpointMismatchError: naming what does not fit.
        """
        state_dict = checkpoint.get('state_dict', checkpoint)
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        strict = bool(getattr(runner, '_resume', False))
        for message in check_checkpoint(
                model,
                state_dict,
                allow_shape_mismatch=self.allow_shape_mismatch and not strict,
                allow_uncalibrated=self.allow_uncalibrated and not strict,
                allow_missing=self.allow_missing and not strict):
            runner.logger.log(logging.WARNING, message)
