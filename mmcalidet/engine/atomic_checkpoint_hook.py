# Copyright (c) mmcalidet contributors. All rights reserved.
""":class:`AtomicCheckpointHook` (with :class:`AtomicLocalBackend`):
mmengine 0.10.7's ``CheckpointHook`` (1) deletes the outdated checkpoint
(``max_keep_ckpts``), (2) writes the new one in place and (3) rewrites
``last_checkpoint`` in place. A kill during (2) leaves a truncated
``iter_N.pth`` and, with ``max_keep_ckpts=1``, nothing to resume from; a
kill during (3) leaves an empty ``last_checkpoint``. Here the parent's
code runs unchanged, with: (2) through a file backend that writes a
temporary file and renames it onto the target; (1) deferred until the
parent's hook method has returned, i.e. after (2) and (3); (3) checked
before the next run resumes (an empty or dangling ``last_checkpoint`` is
pointed at the newest complete checkpoint).

A config registers it by importing ``mmcalidet.engine.checkpoint_hooks``
(see there) and uses it with::

    default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
"""
import contextlib
import glob
import os
import os.path as osp
from pathlib import Path
from typing import List, Optional, Tuple, Union

from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.fileio import BaseStorageBackend, LocalBackend, register_backend
from mmengine.fileio.backends.registry_utils import backends
from mmengine.hooks import CheckpointHook

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


class _DeferredRemovals:
    """A file backend whose ``remove`` and ``rmtree`` wait for
    :meth:`flush` (or are dropped by :meth:`discard`); everything else is
    the wrapped backend's.

    Args:
        backend (BaseStorageBackend): the backend to wrap.
    """

    def __init__(self, backend: BaseStorageBackend) -> None:
        self.backend = backend
        self.pending: List[Tuple[str, str]] = []

    def remove(self, filepath) -> None:
        self.pending.append(('remove', filepath))

    def rmtree(self, dir_path) -> None:
        self.pending.append(('rmtree', dir_path))

    def flush(self) -> None:
        """Carry out the removals asked for so far, in order."""
        pending, self.pending = self.pending, []
        for method, path in pending:
            exists = self.backend.isfile(path) if method == 'remove' \
                else self.backend.isdir(path)
            if exists:
                getattr(self.backend, method)(path)

    def discard(self) -> None:
        """Forget the removals asked for so far."""
        self.pending = []

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


def _is_remote(out_dir: Optional[str]) -> bool:
    """Whether a checkpoint folder is a URI (``s3://...``), not a path."""
    return out_dir is not None and '://' in str(out_dir)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` that never leaves a truncated or missing latest
    checkpoint behind a kill.

    mmengine's saving code runs unchanged (no copy of it here); what it
    writes and removes goes through file backends that make it safe:

    - checkpoints are written through :class:`AtomicLocalBackend` (unless
      ``out_dir`` is a remote URI or ``backend_args`` /
      ``file_client_args`` name another backend);
    - the checkpoints mmengine removes (``max_keep_ckpts``, the previous
      best one) are removed only once the hook method that saves has
      returned, i.e. after the new checkpoint is complete and
      ``last_checkpoint`` names it; when saving fails, nothing is removed;
    - mmengine rewrites ``last_checkpoint`` in place (a few bytes): if a
      kill leaves it empty or naming a missing file, it is pointed at the
      newest complete checkpoint before the next run resumes
      (``before_run``);
    - temporary files left by a killed run are removed before training.

    ``tests/test_reliability/test_checkpoint_safety.py`` checks this order
    on mmengine's hook as installed (a failed save, removal after saving,
    a repaired ``last_checkpoint``), so a change in mmengine that breaks it
    fails the tests rather than silently.

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
                not _is_remote(out_dir):
            backend_args = dict(backend=ATOMIC_BACKEND)
        super().__init__(
            *args,
            out_dir=out_dir,
            backend_args=backend_args,
            file_client_args=file_client_args,
            **kwargs)

    def _checkpoint_pattern(self) -> str:
        """A glob pattern of this hook's checkpoint file names."""
        return glob.escape(self.filename_tmpl).replace('{}', '*')

    def _local_out_dir(self, runner) -> Optional[str]:
        """The folder checkpoints go to, as ``before_train`` will set it
        (the work dir, or ``out_dir/<work dir's name>``); ``None`` for a
        remote ``out_dir``."""
        if self.out_dir is None:
            return runner.work_dir
        if _is_remote(self.out_dir):
            return None
        return osp.join(
            str(self.out_dir), osp.basename(runner.work_dir.rstrip(osp.sep)))

    def before_run(self, runner) -> None:
        """Repair a ``last_checkpoint`` a kill left empty or dangling, before
        the runner resumes from it.

        Args:
            runner (Runner): the runner.
        """
        super().before_run(runner)
        save_file = osp.join(runner.work_dir, 'last_checkpoint')
        out_dir = self._local_out_dir(runner)
        if not is_main_process() or out_dir is None or \
                not osp.isfile(save_file):
            return
        with open(save_file) as f:
            named = f.read().strip()
        if named and osp.exists(named):
            return
        pattern = self._checkpoint_pattern()
        prefix, _, suffix = self.filename_tmpl.partition('{}')
        steps = []
        for path in glob.glob(osp.join(glob.escape(out_dir), pattern)):
            step = osp.basename(path)[len(prefix):][:-len(suffix) or None]
            if step.isdigit():
                steps.append((int(step), path))
        if steps:
            latest = max(steps)[1]
            runner.logger.warning(
                f'{save_file} named {named!r}, which does not exist (a '
                f'kill while it was written); it now names {latest}')
            with atomic_write(save_file) as f:
                f.write(latest)
        else:
            runner.logger.warning(
                f'removing {save_file}: it named {named!r}, which does '
                'not exist, and there is no checkpoint to resume from')
            os.remove(save_file)

    def before_train(self, runner) -> None:
        """Set up as ``CheckpointHook``, defer its removals (see the class),
        then remove the temporary files of checkpoints whose writing a kill
        interrupted.

        Args:
            runner (Runner): the runner.
        """
        super().before_train(runner)  # a new file backend each time
        self.file_backend = _DeferredRemovals(self.file_backend)
        if not is_main_process() or \
                not isinstance(self.file_backend.backend, AtomicLocalBackend):
            return
        # atomic_write names its temporary files
        # <name>.incomplete-<random>.tmp (before: .<name>.<random>.tmp)
        name = self._checkpoint_pattern()
        out_dir = glob.escape(self.out_dir)
        for path in sorted(
                glob.glob(osp.join(out_dir, f'{incomplete_prefix(name)}*'
                                   f'{INCOMPLETE_SUFFIX}')) +
                glob.glob(osp.join(out_dir, f'.{name}.*.tmp'))):
            runner.logger.warning(
                f'removing {path}, an incomplete checkpoint of an '
                'interrupted run')
            os.remove(path)

    @contextlib.contextmanager
    def _removals_after_saving(self):
        """Remove what the parent asked to remove only if the block (a
        parent hook method that may save) completes."""
        backend = self.file_backend
        if not isinstance(backend, _DeferredRemovals):
            yield
            return
        try:
            yield
        except BaseException:
            backend.discard()
            raise
        backend.flush()

    def after_train_iter(self, runner, *args, **kwargs) -> None:
        """mmengine's, with its removals after the save (see the class)."""
        with self._removals_after_saving():
            super().after_train_iter(runner, *args, **kwargs)

    def after_train_epoch(self, runner) -> None:
        """mmengine's, with its removals after the save (see the class)."""
        with self._removals_after_saving():
            super().after_train_epoch(runner)

    def after_val_epoch(self, runner, metrics) -> None:
        """mmengine's, with its removals after the save (see the class)."""
        with self._removals_after_saving():
            super().after_val_epoch(runner, metrics)
