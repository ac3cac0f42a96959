# Copyright (c) mmcalidet contributors. All rights reserved.
"""``SelfCalibrationTestLoop``: self-calibration on subsets (see
``loops.py``), through
:func:`mmcalidet.evaluation.protocol.self_calibration`."""
import os.path as osp
from typing import Dict, List, Optional

from mmdet.registry import LOOPS

from ..calibration import DEFAULT_SCORE_THR, DEFAULT_TRUST_RADIUS
from ..calibration.update import check_self_calibration_args
from ..evaluation import (Rescorer, cache_evaluator, calibration_subsets,
                          markdown_table)
from ..evaluation.protocol import self_calibration
from ..evaluation.sweep import Method
from ..utils.validation import check_int
from .cached_test_loop import CachedTestLoop


@LOOPS.register_module()
class SelfCalibrationTestLoop(CachedTestLoop):
    """Self-calibration (Algo. 1) on random subsets of the test set.

    Metrics: ``selfcal/<metric>@0`` (E_t), ``selfcal/<metric>@last`` and
    ``selfcal/gain``; the averaged history goes to
    ``<log_dir>/self_calibration.json`` and its curves to
    ``self_calibration.png``.

    Args:
        subset_size (int): images per subset (0: the whole test set).
        num_images (int, optional): images used (default all).
        seed (int): split seed.
        iters, eta, score_thr, tol: see
            :func:`mmcalidet.calibration.self_calibrate`.
        **kwargs: see :class:`CachedTestLoop`.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 subset_size: int = 0,
                 num_images: Optional[int] = None,
                 seed: int = 0,
                 iters: int = 20,
                 eta: float = 4.0,
                 score_thr: Optional[float] = None,
                 tol: float = 1e-3,
                 **kwargs) -> None:
        check_self_calibration_args(
            iters=iters,
            eta=eta,
            score_thr=DEFAULT_SCORE_THR if score_thr is None else score_thr,
            tol=tol)
        check_int('subset_size', subset_size, 0)
        check_int('num_images', num_images, 1, allow_none=True)
        super().__init__(runner, dataloader, evaluator, **kwargs)
        self.subset_size = int(subset_size)
        self.num_images = num_images
        self.seed = seed
        self.options = dict(
            iters=iters,
            eta=eta,
            score_thr=DEFAULT_SCORE_THR if score_thr is None else score_thr,
            tol=tol)

    def evaluate_cache(self, cache) -> Dict:
        from ..evaluation.report import write_report
        from ..visualization import plot_self_calibration
        options = self.options
        parts = calibration_subsets(
            len(cache), self.subset_size, self.num_images, self.seed)
        partitions = {f'subset {i}': p for i, p in enumerate(parts)}
        method = Method(
            'model',
            Rescorer(self.detector, cache, batch_size=self.rescore_batch_size))
        table = self_calibration([method],
                                 cache_evaluator(self.coco_evaluator()),
                                 self.e_t,
                                 partitions,
                                 radii=DEFAULT_TRUST_RADIUS,
                                 batch_size=self.rescore_batch_size,
                                 **options)
        out = table.extras['runs'][('model', DEFAULT_TRUST_RADIUS)]
        mean: List[Dict] = out['mean']
        log_dir = self.runner.log_dir
        write_report(
            log_dir, 'self_calibration', 'Self-calibration',
            [(None,
              markdown_table(mean, [('iter', 'iter', ''), ('AP', 'AP', 'pct'),
                                    ('step_mae', 'step MAE', '.4f'),
                                    ('step_max', 'step MAX', '.4f')])),
             ('Per subset', table.markdown)],
            dict(options=options, history=mean, subsets=table.rows))
        plot_self_calibration(mean, osp.join(log_dir, 'self_calibration.png'))
        return {
            'selfcal/AP@0': mean[0]['AP'],
            'selfcal/AP@last': mean[-1]['AP'],
            'selfcal/gain': mean[-1]['AP'] - mean[0]['AP'],
            'selfcal/iters': len(mean) - 1,
            'selfcal/subsets': len(out['subsets']),
            'selfcal/score_thr': options['score_thr'],
        }
