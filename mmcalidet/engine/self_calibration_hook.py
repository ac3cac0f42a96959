# Copyright (c) mmcalidet contributors. All rights reserved.
"""Online self-calibration inside mmengine's test / val loops."""
import os.path as osp
from typing import Optional, Sequence

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from ..calibration import (DEFAULT_SCORE_THR, DEFAULT_TRUST_RADIUS,
                           OnlineSelfCalibrator)
from ..calibration.update import check_self_calibration_args
from ..priors.prior_source import model_classes


@HOOKS.register_module()
class OnlineSelfCalibrationHook(Hook):
    """Self-calibrate a CaliDet model from its own predictions while a test
    (or validation) loop runs (see
    :class:`~mmcalidet.calibration.OnlineSelfCalibrator`).

    After every iteration the batch's predictions update the running
    statistics; every ``update_interval`` images E_c is updated and
    injected, so later batches are predicted under it. At the end of the
    epoch the final E_c is logged, optionally written to the work
    directory as a prior file, and the original prior restored.

    Args:
        eta (float): step size of an update. Defaults to 1.0.
        momentum (float): per-image decay of the running statistics.
            Defaults to 0.99.
        score_thr (float): score from which a class counts as predicted.
        update_interval (int): images between updates. Defaults to 16.
        warmup (int): images before the first update. Defaults to 32.
        trust_radius (float, optional): keep E_c within this mean absolute
            distance of the starting prior. Defaults to
            :data:`~mmcalidet.calibration.DEFAULT_TRUST_RADIUS`; ``None``:
            no limit.
        init_prior (str, optional): E_c at the start (a prior file or
            shipped name); default the model's deployment prior.
        restore (bool): restore the model's prior after the epoch.
            Defaults to True.
        save_prior (str, optional): file name (in ``work_dir``) for the
            final E_c. Defaults to ``'self_calibrated_prior.json'``.
        modes (Sequence[str]): ``'test'`` and/or ``'val'``.
    """

    priority = 'NORMAL'

    def __init__(
        self,
        eta: float = 1.0,
        momentum: float = 0.99,
        score_thr: float = DEFAULT_SCORE_THR,
        update_interval: int = 16,
        warmup: int = 32,
        trust_radius: Optional[float] = DEFAULT_TRUST_RADIUS,
        init_prior: Optional[str] = None,
        restore: bool = True,
        save_prior: Optional[str] = 'self_calibrated_prior.json',
        modes: Sequence[str] = ('test', )
    ) -> None:
        check_self_calibration_args(
            eta=eta,
            momentum=momentum,
            score_thr=score_thr,
            update_interval=update_interval,
            warmup=warmup,
            trust_radius=trust_radius)
        unknown = set(modes) - {'test', 'val'}
        if unknown:
            raise ValueError(f'modes must be test / val, got {unknown}')
        self.options = dict(
            eta=eta,
            momentum=momentum,
            score_thr=score_thr,
            update_interval=update_interval,
            warmup=warmup,
            trust_radius=trust_radius)
        self.init_prior = init_prior
        self.restore = restore
        self.save_prior = save_prior
        self.modes = tuple(modes)
        self.calibrator: Optional[OnlineSelfCalibrator] = None
        self._saved = None

    @staticmethod
    def _model(runner):
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    @staticmethod
    def _classes(runner, model):
        classes = model_classes(model)
        if classes:
            return classes
        for loop in ('_test_loop', '_val_loop'):
            loader = getattr(getattr(runner, loop, None), 'dataloader', None)
            meta = getattr(getattr(loader, 'dataset', None), 'metainfo', {})
            if meta and meta.get('classes'):
                return meta['classes']
        return None

    def _start(self, runner, mode: str) -> None:
        if mode not in self.modes:
            return
        model = self._model(runner)
        if not hasattr(model, 'set_prior'):
            raise TypeError('OnlineSelfCalibrationHook needs a CaliDet '
                            f'model, got {type(model).__name__}')
        self._saved = model.get_prior()
        init = None
        if self.init_prior is not None:
            model.set_prior(self.init_prior)
            init = model.get_prior()
        self.calibrator = OnlineSelfCalibrator(
            model=model, init_prior=init, **self.options)

    def _iter(self, outputs) -> None:
        if self.calibrator is not None and outputs:
            self.calibrator.update(list(outputs))

    def _end(self, runner) -> None:
        cal, self.calibrator = self.calibrator, None
        if cal is None:
            return
        model = self._model(runner)
        runner.logger.info(
            f'online self-calibration: {cal.num_images} images, '
            f'{cal.num_updates} updates, last step MAE '
            f'{cal.last_step["step_mae"]:.5f} MAX '
            f'{cal.last_step["step_max"]:.5f}')
        try:
            if self.save_prior:
                from ..priors import Prior
                classes = self._classes(runner, model)
                path = osp.join(runner.work_dir, self.save_prior)
                if classes is not None:
                    # E_c with the support it was scored with (the start
                    # prior's, for a support-aware CaliFormer)
                    Prior(
                        cal.prior,
                        list(classes),
                        *(cal.init_support or (None, None)),
                        meta=dict(
                            source='online self-calibration',
                            images_seen=cal.num_images,
                            num_updates=cal.num_updates,
                            options=self.options),
                        name=path).save(path)
                    runner.logger.info(f'self-calibrated prior: {path}')
                else:
                    runner.logger.warning(
                        'no class names: the self-calibrated prior is not '
                        'saved')
        finally:
            # the model's own prior back even when saving failed
            if self.restore and self._saved is not None:
                model.set_prior(self._saved)

    def before_test_epoch(self, runner) -> None:
        self._start(runner, 'test')

    def after_test_iter(self,
                        runner,
                        batch_idx,
                        data_batch=None,
                        outputs=None) -> None:
        self._iter(outputs)

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._end(runner)

    def before_val_epoch(self, runner) -> None:
        self._start(runner, 'val')

    def after_val_iter(self,
                       runner,
                       batch_idx,
                       data_batch=None,
                       outputs=None) -> None:
        self._iter(outputs)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._end(runner)
