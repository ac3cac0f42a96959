# Copyright (c) mmcalidet contributors. All rights reserved.
"""Test loops that run the evaluation protocol from a config.

Each loop makes one pass over the test data loader (calling the usual
``before_test_iter`` / ``after_test_iter`` hooks with the predictions under
the model's deployment prior), caches the last decoder layer, and then
re-scores the cache:

* :class:`PriorSweepTestLoop` -- the config's ``test_evaluator`` under each
  prior of the standard table (metrics prefixed by the prior);
* :class:`SubsetEvalTestLoop` -- subset evaluation (E_t vs E_b);
* :class:`SelfCalibrationTestLoop` -- self-calibration on subsets.

Use: ``test_cfg = dict(type='PriorSweepTestLoop', priors=[...])`` and
``tools/test.py``. Single process only (the oracle priors need the labels
of the whole evaluation set).
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmdet.registry import LOOPS
from mmengine.dist import get_world_size
from mmengine.model import is_model_wrapper
from mmengine.runner import TestLoop

from ..evaluation import (METRICS, SUBSET_SIZES, CocoEvaluator, Rescorer,
                          build_priors, cache_evaluator, cache_hidden_states,
                          calibration_subsets, check_expected_order,
                          evaluate_subsets, format_order_verdict,
                          markdown_table, self_calibrate_partitions)
from ..evaluation.sweep import Method, parse_prior_names
from ..priors import load_prior_source, model_classes, validate_prior
from ..utils.validation import check_float, check_int


class CachedTestLoop(TestLoop):
    """A test loop that caches the decoder outputs in one pass.

    Args:
        runner (Runner): the runner.
        dataloader (DataLoader | dict): the test data loader.
        evaluator (Evaluator | dict | list): the test evaluator.
        fp16 (bool): autocast the pass. Defaults to False.
        train_prior (str | array-like, optional): E_t (a prior file or
            shipped name); default the model's deployment prior when the
            loop starts (the checkpoint's).
        spill_dir (str, optional): write the cache to a private folder
            there (removed after the run) instead of memory.
        cache_dtype (str): ``'float32'`` (exact) or ``'float16'``.
        rescore_batch_size (int): images per re-scoring step.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 fp16: bool = False,
                 train_prior=None,
                 spill_dir: Optional[str] = None,
                 cache_dtype: str = 'float32',
                 rescore_batch_size: int = 64) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)
        self.train_prior_src = train_prior
        self.spill_dir = spill_dir
        self.cache_dtype = getattr(torch, cache_dtype)
        self.rescore_batch_size = rescore_batch_size
        self.e_t: Optional[np.ndarray] = None

    @property
    def detector(self):
        model = self.runner.model
        return model.module if is_model_wrapper(model) else model

    def train_prior(self) -> np.ndarray:
        """E_t as a K x K array."""
        model = self.detector
        if self.train_prior_src is None:
            return model.get_prior()
        return load_prior_source(self.train_prior_src, model_classes(model),
                                 model.bbox_head.num_classes)

    def build_cache(self):
        """One pass over the data loader with the iteration hooks."""
        if get_world_size() > 1:
            raise RuntimeError(f'{type(self).__name__} runs in a single '
                               'process')
        model = self.detector
        model.eval()

        def before(batch_id, batch):
            self.runner.call_hook(
                'before_test_iter', batch_idx=batch_id, data_batch=batch)

        def after(batch_id, batch, outputs):
            self.runner.call_hook(
                'after_test_iter',
                batch_idx=batch_id,
                data_batch=batch,
                outputs=outputs)

        with torch.autocast(
                device_type=next(model.parameters()).device.type,
                enabled=self.fp16):
            return cache_hidden_states(
                model,
                self.dataloader,
                cache_dir=self.spill_dir,
                dtype=self.cache_dtype,
                progress=False,
                callback=after,
                before_batch=before)

    def coco_evaluator(self) -> CocoEvaluator:
        """A :class:`CocoEvaluator` on the ``CocoMetric`` of the test
        evaluator (its loaded annotations are reused)."""
        classes = self.dataloader.dataset.metainfo['classes']
        for metric in self.evaluator.metrics:
            api = getattr(metric, '_coco_api', None)
            if api is not None:
                return CocoEvaluator(api, classes)
        raise ValueError(f'{type(self).__name__} needs a CocoMetric with an '
                         'ann_file in test_evaluator')

    def run(self) -> Dict:
        # E_t as the loop starts (hooks may inject priors during the pass)
        self.e_t = validate_prior(self.train_prior())
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        cache = self.build_cache()
        metrics = self.evaluate_cache(cache)
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')
        return metrics

    def evaluate_cache(self, cache) -> Dict:
        raise NotImplementedError


@LOOPS.register_module()
class PriorSweepTestLoop(CachedTestLoop):
    """Evaluate the test evaluator under each prior of the standard
    injection table, from one forward pass.

    Metrics are reported as ``<prior>/<metric>`` (e.g. ``E_t/coco/
    bbox_mAP``); the log states whether the expected order holds, does
    not hold, or is undecidable (all APs within ``order_tol``).

    Args:
        priors (Sequence[str]): prior keys (``flip_E_x``, ``E0``, ``E_t``,
            ``E_v``, ``E_b``, ``E_x``), ``LABEL=FILE`` items (a prior file
            or shipped name) and labels of ``extra_priors``.
        extra_priors (dict, optional): label -> prior file / shipped name.
        order_tol (float): AP differences up to this many AP points (0.1 =
            0.1 AP) count as ties in the expected-order verdict. Defaults
            to 0.
        **kwargs: see :class:`CachedTestLoop`.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 priors: Sequence[str] = ('flip_E_x', 'E0', 'E_t', 'E_v',
                                          'E_b', 'E_x'),
                 extra_priors: Optional[Dict[str, str]] = None,
                 order_tol: float = 0.0,
                 **kwargs) -> None:
        check_float('order_tol', order_tol, 0)
        super().__init__(runner, dataloader, evaluator, **kwargs)
        self.order_tol = order_tol / 100
        self.priors, extra = parse_prior_names(priors)
        self.extra_priors = dict(extra_priors or {}, **extra)

    def evaluate_cache(self, cache) -> Dict:
        model = self.detector
        rescorer = Rescorer(model, cache, batch_size=self.rescore_batch_size)
        classes = self.dataloader.dataset.metainfo.get('classes')
        specs = build_priors(self.priors, cache.gt_label_lists(), self.e_t,
                             cache.batch_ids, self.extra_priors, classes)
        metrics, rows = {}, []
        for spec in specs:
            samples = rescorer.predict_samples(spec.prior)
            step = self.dataloader.batch_size or 1
            for start in range(0, len(samples), step):
                self.evaluator.process(data_samples=samples[start:start +
                                                            step])
            result = self.evaluator.evaluate(len(samples))
            metrics.update({f'{spec.key}/{k}': v for k, v in result.items()})
            ap = next((v for k, v in result.items() if k.endswith('bbox_mAP')),
                      None)
            rows.append(
                dict(
                    method='model',
                    key=spec.key,
                    prior=spec.label,
                    oracle=spec.oracle,
                    AP=ap))
        table = markdown_table(rows, [('prior', 'prior', ''),
                                      ('oracle', 'oracle', ''),
                                      ('AP', 'bbox mAP', '')])
        order = check_expected_order(rows, 'model', tol=self.order_tol)
        self.runner.logger.info(
            f'prior sweep:\n{table}\nexpected order '
            f'{" <= ".join(order["order"])}: {format_order_verdict(order)}')
        return metrics


@LOOPS.register_module()
class SubsetEvalTestLoop(CachedTestLoop):
    """Subset evaluation: COCO metrics averaged over random subsets of each
    size under E_t and under each subset's E_b.

    Metrics: ``subset<size>/<E_t|E_b>/<AP...>``, ``subset<size>/epsilon``.

    Args:
        sizes (Sequence[int]): subset sizes.
        seed (int): split seed.
        **kwargs: see :class:`CachedTestLoop`.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 sizes: Sequence[int] = SUBSET_SIZES,
                 seed: int = 0,
                 **kwargs) -> None:
        super().__init__(runner, dataloader, evaluator, **kwargs)
        self.sizes = [int(s) for s in sizes]
        self.seed = seed

    def evaluate_cache(self, cache) -> Dict:
        method = Method(
            'model',
            Rescorer(self.detector, cache, batch_size=self.rescore_batch_size))
        rows = evaluate_subsets([method],
                                cache_evaluator(self.coco_evaluator()),
                                self.e_t,
                                self.sizes,
                                self.seed,
                                progress=False)
        metrics = {}
        for row in rows:
            prefix = f'subset{row["size"]}'
            if row['prior'] == 'E_b':
                metrics[f'{prefix}/epsilon'] = row['epsilon']
            for m in METRICS:
                if m in row:
                    metrics[f'{prefix}/{row["prior"]}/{m}'] = row[m]
        return metrics


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
            :func:`mmcalidet.evaluation.self_calibrate`.
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
        from ..evaluation import DEFAULT_SCORE_THR
        from ..evaluation.self_calibration import check_self_calibration_args
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
        out = self_calibrate_partitions(
            self.detector,
            cache,
            calibration_subsets(
                len(cache), self.subset_size, self.num_images, self.seed),
            evaluate=cache_evaluator(self.coco_evaluator()),
            progress=False,
            init_prior=self.e_t,
            batch_size=self.rescore_batch_size,
            **options)
        mean: List[Dict] = out['mean']
        log_dir = self.runner.log_dir
        write_report(
            log_dir, 'self_calibration', 'Self-calibration',
            [(None,
              markdown_table(mean, [('iter', 'iter', ''), ('AP', 'AP', 'pct'),
                                    ('step_mae', 'step MAE', '.4f'),
                                    ('step_max', 'step MAX', '.4f')]))],
            dict(options=options, history=mean))
        plot_self_calibration(mean, osp.join(log_dir, 'self_calibration.png'))
        return {
            'selfcal/AP@0': mean[0]['AP'],
            'selfcal/AP@last': mean[-1]['AP'],
            'selfcal/gain': mean[-1]['AP'] - mean[0]['AP'],
            'selfcal/iters': len(mean) - 1,
            'selfcal/subsets': len(out['subsets']),
            'selfcal/score_thr': options['score_thr'],
        }
