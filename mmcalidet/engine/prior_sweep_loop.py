# Copyright (c) mmcalidet contributors. All rights reserved.
"""``PriorSweepTestLoop``: the config's ``test_evaluator`` under each prior
of the standard injection table (see ``loops.py``), through
:func:`mmcalidet.evaluation.protocol.injection`."""
from typing import Dict, Optional, Sequence

from mmdet.registry import LOOPS

from ..decoder_cache import with_predictions
from ..evaluation import Rescorer, format_order_verdict
from ..evaluation.protocol import injection
from ..evaluation.sweep import Method, parse_prior_names
from ..utils.validation import check_float
from .cached_test_loop import CachedTestLoop

#: the protocol's metric names -> the suffix of mmdet's CocoMetric keys
COCO_NAMES = dict(
    AP='bbox_mAP',
    AP50='bbox_mAP_50',
    AP75='bbox_mAP_75',
    APs='bbox_mAP_s',
    APm='bbox_mAP_m',
    APl='bbox_mAP_l')


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

    def run_evaluator(self, cache, preds) -> Dict:
        """The test evaluator on a cache's predictions, in data loader
        batches; its metrics plus the COCO names of the protocol's tables
        (``AP``, ``AP50``, ...)."""
        samples = [
            with_predictions(cache.data_samples[k], p)
            for k, p in enumerate(preds)
        ]
        step = self.dataloader.batch_size or 1
        for start in range(0, len(samples), step):
            self.evaluator.process(data_samples=samples[start:start + step])
        result = self.evaluator.evaluate(len(samples))
        coco = {}
        for name, suffix in COCO_NAMES.items():
            coco[name] = next(
                (v for k, v in result.items() if k.endswith(suffix)), None)
        return dict(result, **coco)

    def evaluate_cache(self, cache) -> Dict:
        results = []

        def evaluate(cache, preds):
            results.append(self.run_evaluator(cache, preds))
            return {k: results[-1][k] for k in COCO_NAMES}

        method = Method(
            'model',
            Rescorer(self.detector, cache, batch_size=self.rescore_batch_size))
        table = injection([method],
                          evaluate,
                          self.e_t,
                          self.priors,
                          self.extra_priors,
                          self.dataloader.dataset.metainfo.get('classes'),
                          tol=self.order_tol,
                          progress=False)
        metrics = {}
        for row, result in zip(table.rows, results):
            metrics.update({
                f'{row["key"]}/{k}': v
                for k, v in result.items() if k not in COCO_NAMES
            })
        order = table.extras['orders']['model']
        self.runner.logger.info(
            f'prior sweep:\n{table.markdown}\nexpected order '
            f'{" <= ".join(order["order"])}: {format_order_verdict(order)}')
        return metrics
