# Copyright (c) mmcalidet contributors. All rights reserved.
"""``PriorSweepTestLoop``: the config's ``test_evaluator`` under each prior
of the standard injection table (see ``loops.py``)."""
from typing import Dict, Optional, Sequence

from mmdet.registry import LOOPS

from ..evaluation import (Rescorer, build_priors, check_expected_order,
                          format_order_verdict, markdown_table)
from ..evaluation.sweep import parse_prior_names
from ..utils.validation import check_float
from .cached_test_loop import CachedTestLoop


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
