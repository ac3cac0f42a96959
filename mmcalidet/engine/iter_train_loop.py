# Copyright (c) mmcalidet contributors. All rights reserved.
"""An iteration-based training loop that restarts a worker-less data
loader at once.

mmengine's ``IterBasedTrainLoop`` restarts its data loader at the end of
each pass over the data and then sleeps 2 s (to avoid a dead lock of the
loader's worker processes). A loader without workers
(``num_workers=0``, the CPU configs') has none to wait for: the tiny
schedule's 400 iterations over coco-mini (10 passes) spent 20 s asleep, a
calibrator's 3,000 updates over the context-shift cache 12 s.
"""
from mmdet.registry import LOOPS
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator


class _PromptRestarts(_InfiniteDataloaderIterator):
    """mmengine's infinite iterator over a data loader without worker
    processes, restarted without the 2 s sleep (and without the warning
    that recommends the ``InfiniteSampler``: the configs keep the
    ``DefaultSampler`` and its per-pass order).

    Args:
        restarts (_InfiniteDataloaderIterator): the iterator the loop made;
            its loader, pass and position are taken over (making another
            would draw a loader seed from torch's generator).
    """

    def __init__(self, restarts: _InfiniteDataloaderIterator) -> None:
        self._dataloader = restarts._dataloader
        self._iterator = restarts._iterator
        self._epoch = restarts._epoch

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            pass
        self._epoch += 1
        sampler = getattr(self._dataloader, 'sampler', None)
        batch_sampler = getattr(self._dataloader, 'batch_sampler', None)
        if hasattr(sampler, 'set_epoch'):
            sampler.set_epoch(self._epoch)
        elif hasattr(getattr(batch_sampler, 'sampler', None), 'set_epoch'):
            batch_sampler.sampler.set_epoch(self._epoch)
        self._iterator = iter(self._dataloader)
        return next(self._iterator)


@LOOPS.register_module()
class PromptIterBasedTrainLoop(IterBasedTrainLoop):
    """mmengine's ``IterBasedTrainLoop`` whose data loader, when it has no
    worker processes, starts its next pass at once (the batches, their
    order and every random draw are the parent's; a loader with workers
    keeps the parent's 2 s wait). Use
    ``train_cfg = dict(type='PromptIterBasedTrainLoop', max_iters=...)``.

    Args:
        *args, **kwargs: those of ``IterBasedTrainLoop``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.dataloader, 'num_workers', 0) == 0:
            self.dataloader_iterator = _PromptRestarts(
                self.dataloader_iterator)
