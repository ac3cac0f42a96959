# Copyright (c) mmcalidet contributors. All rights reserved.
"""The evaluation protocol, one function per table.

Each function runs one table of the paper's protocol on cached decoder
outputs (the methods of an :class:`~mmcalidet.evaluation.EvalSetup` or
any :class:`~mmcalidet.evaluation.sweep.Method` list) and returns a
:class:`ProtocolTable`: its rows, its Markdown table and what else the
callers need (the expected-order verdicts, the self-calibration curves):

* :func:`injection` -- the standard injection table (build the priors,
  evaluate them, check the expected order);
* :func:`sites` -- per deployment site, E_t against the site's prior;
* :func:`deployment` -- a site prior from a few labelled site images;
* :func:`sweep` -- each site's prior swept, ``E_t + alpha (E_site -
  E_t)``;
* :func:`subsets` -- random subsets, E_t against each subset's E_b;
* :func:`self_calibration` -- Algo. 1 on each partition (site or subset);
* :func:`online` -- online self-calibration, each partition streamed.

The tools (``tools/analysis_tools/eval_priors.py``), the test loops
(:mod:`mmcalidet.engine.loops`), the context-shift benchmark and the
benchmarks call these; none of them wires the chain by hand. The tables of
a site prior and of self-calibration compose :mod:`mmcalidet.calibration`
(this is the one module of the evaluation that imports it); each table's
Markdown layout is :mod:`.report`'s.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from ..calibration import (DEFAULT_ACCEPT, DEFAULT_ETA, DEFAULT_SCORE_THR,
                           DEFAULT_TRUST_RADIUS, deployment_gains,
                           self_calibrate_partitions, stream_site)
from . import report
from .coco import CocoEvaluator
from .partitions import SUBSET_SIZES, evaluate_subsets
from .site_sweep import SWEEP_ALPHAS, shrinkage_sweep, split_half_sweep
from .split_half import RESAMPLES, evaluate_site_halves, site_halves
from .sweep import (STANDARD_PRIORS, Method, build_priors, evaluate_priors,
                    expected_orders)

#: image indices of each named partition (a site, a subset), table order
Partitions = Dict[str, np.ndarray]
#: a trust radius (``None``: no limit) or several, a row each
Radii = Union[Optional[float], Sequence[Optional[float]]]


@dataclass
class ProtocolTable:
    """One table of the protocol.

    Args:
        rows (list[dict]): the rows (the JSON report's content).
        markdown (str): the Markdown table ('' when there is no row and
            the table is optional).
        extras (dict): what else the table computed (e.g. ``orders``).
    """
    rows: List[Dict]
    markdown: str
    extras: Dict = field(default_factory=dict)


def _takes_prior(methods: Sequence[Method]) -> List[Method]:
    return [m for m in methods if m.takes_prior]


def _radii(value: Radii) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def injection(methods: Sequence[Method],
              evaluate: Callable,
              train_prior: np.ndarray,
              names: Sequence[str] = STANDARD_PRIORS,
              extra: Optional[Dict[str, str]] = None,
              classes: Optional[Sequence[str]] = None,
              orders: Optional[Dict[str, Sequence[str]]] = None,
              tol: float = 0.0,
              progress: bool = True,
              workers: int = 0) -> ProtocolTable:
    """The standard injection table: the priors built from the first
    method's cache, every method evaluated under each, the expected
    order checked.

    Args:
        methods (Sequence[Method]): the detectors (their caches hold the
            same images in the same order).
        evaluate (callable): ``evaluate(cache, predictions) -> metrics``.
        train_prior (np.ndarray): E_t.
        names (Sequence[str]): prior keys in table order.
        extra (dict, optional): label -> prior file / shipped name.
        classes (Sequence[str], optional): the class names (for files).
        orders (dict, optional): name -> prior keys from worst to best,
            each checked for every method that takes a prior (default
            ``{'orders': STANDARD_PRIORS}``).
        tol (float): ties up to ``tol`` (AP in [0, 1]) in the verdicts.
        progress (bool): show a progress bar.
        workers (int): see :func:`evaluate_priors`.

    Returns:
        ProtocolTable: the rows of :func:`evaluate_priors`; extras: the
        ``specs`` (:class:`PriorSpec`) and, per name of ``orders``, each
        method's verdict.
    """
    cache = methods[0].cache
    specs = build_priors(names, cache.gt_label_lists(), train_prior,
                         cache.batch_ids, extra, classes)
    rows = evaluate_priors(methods, specs, evaluate, progress, workers)
    orders = dict(orders=STANDARD_PRIORS) if orders is None else orders
    extras = {
        name: expected_orders(rows, methods, keys, tol)
        for name, keys in orders.items()
    }
    return ProtocolTable(rows, report.injection_table(rows),
                         dict(extras, specs=specs))


def sites(methods: Sequence[Method],
          evaluator: CocoEvaluator,
          train_prior: np.ndarray,
          partitions: Partitions,
          site_priors: Dict[str, np.ndarray],
          train_shares: Optional[np.ndarray] = None,
          in_sample: bool = True,
          resamples: int = RESAMPLES,
          seed: int = 0) -> ProtocolTable:
    """Per deployment site: E_t against the site's statistics, split-half
    (``E_site``: each half under the other half's, with its support) and
    in-sample (``E_site(in-sample)``), each gain with a 90 % paired
    bootstrap interval (:func:`evaluate_site_halves`).

    Args:
        methods (Sequence[Method]): the detectors.
        evaluator (CocoEvaluator): the images' annotations.
        train_prior (np.ndarray): E_t.
        partitions (dict): each site's image indices, in table order.
        site_priors (dict): E_site of each site (all its images).
        train_shares (np.ndarray, optional): training's class shares (the
            relation-only gains); ``None``: none.
        in_sample (bool): also the in-sample rows.
        resamples (int): bootstrap resamples; seed: their seed.

    Returns:
        ProtocolTable: the rows; extras: ``means`` (the mean gain over
        sites, with its interval) and ``summary_md``.
    """
    out = evaluate_site_halves(methods, evaluator, train_prior, partitions,
                               site_priors, train_shares, in_sample, resamples,
                               seed)
    return ProtocolTable(
        out['rows'], report.site_table(out['rows']),
        dict(
            means=out['means'],
            summary_md=report.site_summary_table(out['means'], out['rows'])))


def deployment(methods: Sequence[Method],
               evaluator: CocoEvaluator,
               train_prior: np.ndarray,
               partitions: Partitions,
               labelled: Union[int, Sequence[int]] = 32,
               repeats: int = 10,
               accept: str = DEFAULT_ACCEPT,
               progress: bool = True) -> ProtocolTable:
    """Per site, as a user deploys: a prior estimated from a few labelled
    site images (raw, and fitted toward E_t by cross-validation), scored
    on the site's other images against E_t (:func:`deployment_gains`).

    Args:
        methods (Sequence[Method]): the detectors (those without a prior
            are left out).
        evaluator (CocoEvaluator): the images' annotations.
        train_prior (np.ndarray): E_t.
        partitions (dict): each site's image indices.
        labelled (int | Sequence[int]): labelled images per draw (a row
            pair each); a site keeps at least one image to evaluate on.
        repeats (int): draws per site (0: no rows).
        accept (str): see :func:`~mmcalidet.calibration.fit_site_prior`.
        progress (bool): show progress bars.

    Returns:
        ProtocolTable: per (site, n, method), a ``raw`` and a ``fitted``
        row (``gain``, ``low``, ``high``, ``interval``, ``alpha``); the
        Markdown is '' without rows.
    """
    rows = []
    labelled = [labelled] if isinstance(labelled, int) else list(labelled)
    for site, idx, n in ((s, i, n) for s, i in partitions.items() if repeats
                         for n in labelled):
        num = min(n, len(idx) - 1)
        if num < 2:
            continue
        for m in _takes_prior(methods):
            # the fits' candidate priors are scored once each: keep none
            with m.rescorer.keeping_none():
                res = deployment_gains(
                    m.rescorer,
                    evaluator,
                    train_prior,
                    idx,
                    num_labelled=num,
                    repeats=repeats,
                    progress=progress,
                    desc=f'site prior draws ({site}, {m.name})',
                    accept=accept)
            rows += report.deployment_rows(m.name, site, num, repeats, res)
    return ProtocolTable(rows, report.deployment_table(rows))


def sweep(methods: Sequence[Method],
          evaluator: CocoEvaluator,
          train_prior: np.ndarray,
          partitions: Partitions,
          site_priors: Dict[str, np.ndarray],
          alphas: Sequence[float] = SWEEP_ALPHAS,
          in_sample: bool = True,
          resamples: int = RESAMPLES) -> ProtocolTable:
    """Per site, the dense sweep ``E_t + alpha (E_site - E_t)``: does the
    detector read the direction of the site's shift? Split-half
    (``E_site``, :func:`split_half_sweep`) and, with ``in_sample``, on the
    images E_site was measured on (``E_site(in-sample)``,
    :func:`shrinkage_sweep`); each gain with its 90 % interval.

    Returns:
        ProtocolTable: a row per (site, method, prior, alpha); the Markdown
        is pivoted (:func:`~.report.sweep_table`), a column per alpha.
    """
    labels = methods[0].cache.gt_label_lists() if methods else []
    rows = []
    for site, idx in partitions.items():
        halves = site_halves(labels, idx, len(train_prior))
        for m in _takes_prior(methods):
            got = split_half_sweep(m.rescorer, evaluator, train_prior, halves,
                                   alphas, resamples)
            if in_sample:
                got = shrinkage_sweep(m.rescorer, evaluator, train_prior,
                                      site_priors[site], idx, alphas,
                                      resamples) + got
            rows += [dict(r, site=site, method=m.name) for r in got]
    return ProtocolTable(rows, report.sweep_markdown(rows, alphas))


def subsets(methods: Sequence[Method],
            evaluate: Callable,
            train_prior: np.ndarray,
            sizes: Sequence[int] = SUBSET_SIZES,
            seed: int = 0,
            progress: bool = True) -> ProtocolTable:
    """Random subsets of each size, E_t against each subset's E_b (the
    paper's Tab. 3 layout, :func:`evaluate_subsets`).

    Args:
        methods (Sequence[Method]): the detectors.
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        train_prior (np.ndarray): E_t.
        sizes (Sequence[int]): subset sizes.
        seed (int): split seed.
        progress (bool): show a progress bar.

    Returns:
        ProtocolTable: the rows of :func:`evaluate_subsets`; the Markdown
        is '' without rows.
    """
    rows = evaluate_subsets(methods, evaluate, train_prior, sizes, seed,
                            progress)
    return ProtocolTable(rows, report.subset_table(rows))


def self_calibration(methods: Sequence[Method],
                     evaluate: Callable,
                     train_prior: np.ndarray,
                     partitions: Partitions,
                     site_priors: Optional[Dict[str, np.ndarray]] = None,
                     iters: int = 20,
                     score_thr: float = DEFAULT_SCORE_THR,
                     radii: Radii = DEFAULT_TRUST_RADIUS,
                     tol: float = 0.0,
                     eta: float = DEFAULT_ETA,
                     batch_size: int = 64,
                     progress: bool = False) -> ProtocolTable:
    """Self-calibration (Algo. 1) on each partition, from E_t, within each
    trust radius (:func:`self_calibrate_partitions`).

    Args:
        methods (Sequence[Method]): the detectors (those without a prior
            are left out).
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        train_prior (np.ndarray): E_t, the start.
        partitions (dict): each partition's image indices (sites or
            random subsets).
        site_priors (dict, optional): each partition's own statistics
            (the epsilon columns; ``None`` without).
        iters, score_thr, tol, eta: see
            :func:`~mmcalidet.calibration.self_calibrate`.
        radii (float | Sequence): trust radius (``None``: the paper's
            unbounded loop); several: a row each.
        batch_size (int): images per re-scoring step.
        progress (bool): show a progress bar over partitions.

    Returns:
        ProtocolTable: a row per (partition, method, radius): ``AP_start``
        (E_t), ``AP_end`` (E_c), ``gain``, ``AP_estimate`` (the first
        estimate E_i), the epsilons; extras: ``curves`` (label -> AP
        history) and ``runs`` ((method, radius) ->
        :func:`self_calibrate_partitions`' result).
    """
    names, parts = list(partitions), list(partitions.values())
    options = dict(iters=iters, eta=eta, score_thr=score_thr, tol=tol)
    runs = {
        (m.name, radius):
        self_calibrate_partitions(
            m.rescorer.model,
            m.cache,
            parts,
            evaluate=evaluate,
            progress=progress,
            trust_radius=radius,
            init_prior=train_prior,
            init_support=m.rescorer.support_of(train_prior),
            correction=m.rescorer.correction,
            batch_size=batch_size,
            **options)
        for m in _takes_prior(methods)
        for radius in _radii(radii)
    }
    by_name, curves, rows = {m.name: m for m in methods}, {}, []
    for i, name in enumerate(names):
        for (method, radius), run in runs.items():
            res = run['results'][i]
            label = '' if radius is None else f', radius {radius:g}'
            curves[f'{method}, {name}{label}'] = res.history
            m, idx = by_name[method], parts[i]
            estimate = evaluate(m.cache,
                                m.rescorer.predict(res.start_estimate, idx),
                                idx)['AP']
            rows.append(
                report.self_calibration_row(name, method, score_thr, radius,
                                            res, estimate, train_prior,
                                            (site_priors or {}).get(name)))
    return ProtocolTable(rows, report.self_calibration_table(rows),
                         dict(curves=curves, runs=runs))


def online(methods: Sequence[Method],
           evaluate: Callable,
           train_prior: np.ndarray,
           partitions: Partitions,
           site_priors: Optional[Dict[str, np.ndarray]] = None,
           radii: Radii = DEFAULT_TRUST_RADIUS,
           score_thr: float = DEFAULT_SCORE_THR,
           batch_size: int = 16,
           seed: int = 0) -> ProtocolTable:
    """Online self-calibration on each partition: its images streamed in
    batches from E_t, each predicted under the current E_c and then
    observed (:func:`stream_site`).

    Args:
        methods (Sequence[Method]): the detectors (those without a prior
            are left out).
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        train_prior (np.ndarray): E_t, the start.
        partitions (dict): each partition's image indices.
        site_priors (dict, optional): each partition's own statistics
            (the ``epsilon_end`` column; ``None`` without).
        radii (float | Sequence): the calibrator's trust radius (``None``:
            no limit); several: a row each.
        score_thr (float): the calibrator's score threshold.
        batch_size (int): images per arriving batch.
        seed (int): seed of the arrival order.

    Returns:
        ProtocolTable: a row per (radius, method, partition):
        ``AP_start``, ``AP_stream``, ``gain``, ``updates``,
        ``epsilon_end``.
    """
    rows = []
    for radius in _radii(radii):
        for m in _takes_prior(methods):
            for name, idx in partitions.items():
                run = stream_site(
                    m.rescorer,
                    evaluate,
                    idx,
                    train_prior,
                    radius,
                    batch_size,
                    seed,
                    score_thr=score_thr)
                rows.append(
                    report.online_row(name, m.name, radius, run,
                                      (site_priors or {}).get(name)))
    return ProtocolTable(rows, report.online_table(rows))
