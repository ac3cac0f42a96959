# Copyright (c) mmcalidet contributors. All rights reserved.
"""Checkpoints at chosen iterations (a learning curve from one run)."""
from typing import Sequence

from mmdet.registry import HOOKS
from mmengine.hooks import Hook


@HOOKS.register_module()
class SnapshotHook(Hook):
    """Save the model (no optimizer or scheduler state) as
    ``snapshot_iter_<N>.pth`` after each of the given iterations, e.g. to
    evaluate a calibrator after 1k, 10k and 100k updates of one run.

    Args:
        iters (Sequence[int]): the iterations (1-based, as the logs count).
    """

    priority = 'LOW'

    def __init__(self, iters: Sequence[int]) -> None:
        iters = sorted({int(i) for i in iters})
        if not iters or iters[0] < 1:
            raise ValueError(f'SnapshotHook: iters must be >= 1, got {iters}')
        self.iters = set(iters)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """Save a snapshot after a chosen iteration."""
        if runner.iter + 1 in self.iters:
            runner.save_checkpoint(
                runner.work_dir,
                f'snapshot_iter_{runner.iter + 1}.pth',
                save_optimizer=False,
                save_param_scheduler=False)
