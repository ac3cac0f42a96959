# Copyright (c) mmcalidet contributors. All rights reserved.
"""Probes for tools/train.py subprocesses in tests, loaded with
``custom_imports`` (the test puts this folder on ``PYTHONPATH``)."""
import os
import os.path as osp
import signal

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper


def _unwrap(runner):
    return runner.model.module if is_model_wrapper(runner.model) \
        else runner.model


@HOOKS.register_module()
class KillHook(Hook):
    """SIGKILL the process after iteration ``iteration`` (after its
    checkpoint is saved), or, with ``during_save``, while the checkpoint of
    that iteration is being written: its temporary file half-written, not
    yet renamed."""

    priority = 'LOWEST'

    def __init__(self, iteration: int, during_save: bool = False) -> None:
        self.iteration = iteration
        self.during_save = during_save

    def before_train(self, runner) -> None:
        if not self.during_save:
            return
        target = f'iter_{self.iteration}.pth'
        replace = os.replace

        def killing_replace(src, dst, *args, **kwargs):
            if osp.basename(os.fspath(dst)) == target:
                os.truncate(src, os.path.getsize(src) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            return replace(src, dst, *args, **kwargs)

        os.replace = killing_replace

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if not self.during_save and runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class RankDumpHook(Hook):
    """Save every rank's final weights and, per iteration, the labels and
    priors the EdgeSampler gave its samples, to ``work_dir/rank<r>.pth``."""

    priority = 'LOWEST'

    def before_train(self, runner) -> None:
        self.records = []
        model = _unwrap(runner)
        for augment in model.data_preprocessor.batch_augments or []:
            if type(augment).__name__ == 'EdgeSampler':
                augment.register_forward_hook(self._record)

    def _record(self, module, args, output) -> None:
        _, samples = output
        self.records.append(
            dict(
                labels=[s.gt_instances.labels.clone() for s in samples],
                priors=torch.stack([s.prior for s in samples]),
                mode=samples[0].metainfo['prior_mode']))

    def after_train(self, runner) -> None:
        torch.save(
            dict(
                state_dict=_unwrap(runner).state_dict(), records=self.records),
            osp.join(runner.work_dir, f'rank{runner.rank}.pth'))
