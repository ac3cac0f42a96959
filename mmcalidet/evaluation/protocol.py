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
benchmarks call these; none of them wires the chain by hand.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from ..priors import prior_mae
from .coco import CocoEvaluator
from .online import stream_site
from .partitions import SUBSET_SIZES, evaluate_groups, evaluate_subsets
from .report import injection_table, markdown_table, metric_columns
from .self_calibration import (DEFAULT_ETA, DEFAULT_SCORE_THR,
                               DEFAULT_TRUST_RADIUS, self_calibrate_partitions)
from .site_prior import (DEFAULT_ACCEPT, SWEEP_ALPHAS, deployment_gains,
                         shrinkage_sweep)
from .sweep import (STANDARD_PRIORS, Method, build_priors,
                    check_expected_order, evaluate_priors,
                    format_order_verdict)

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


def _metric_table(rows: Sequence[Dict], keys: Sequence, gain: bool = True):
    return markdown_table(
        rows,
        list(keys) + metric_columns() +
        ([('gain_AP', 'AP gain', 'gain')] if gain else []))


def expected_orders(rows: Sequence[Dict],
                    methods: Sequence[Method],
                    order: Sequence[str] = STANDARD_PRIORS,
                    tol: float = 0.0) -> Dict[str, Dict]:
    """:func:`check_expected_order` of each method that takes a prior.

    Args:
        rows (Sequence[dict]): :func:`evaluate_priors` rows.
        methods (Sequence[Method]): the methods.
        order (Sequence[str]): prior keys from worst to best.
        tol (float): ties up to ``tol`` (AP in [0, 1]).

    Returns:
        dict: method name -> the order's verdict.
    """
    return {
        m.name: check_expected_order(rows, m.name, order, tol=tol)
        for m in _takes_prior(methods)
    }


def order_lines(orders: Dict[str, Dict], prefix: str = '- ') -> List[str]:
    """One Markdown line per method: ``<prefix><method>: a <= b ...:
    **verdict**``."""
    return [
        f'{prefix}{method}: {" <= ".join(order["order"])}: '
        f'**{format_order_verdict(order)}**'
        for method, order in orders.items()
    ]


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
    return ProtocolTable(rows, injection_table(rows),
                         dict(extras, specs=specs))


def sites(methods: Sequence[Method], evaluate: Callable,
          train_prior: np.ndarray, groups: Sequence[str],
          site_priors: Dict[str, np.ndarray]) -> ProtocolTable:
    """Per deployment site: E_t against the site's own statistics
    (:func:`evaluate_groups`).

    Args:
        methods (Sequence[Method]): the detectors.
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        train_prior (np.ndarray): E_t.
        groups (Sequence[str]): the site of each cached image.
        site_priors (dict): E_site of each site, in table order.

    Returns:
        ProtocolTable: the rows of :func:`evaluate_groups`.
    """
    rows = evaluate_groups(methods, evaluate, train_prior, groups,
                           list(site_priors), site_priors)
    return ProtocolTable(
        rows,
        _metric_table(rows,
                      [('site', 'site', ''), ('num_images', 'images', ''),
                       ('epsilon', 'epsilon', '.3f'), ('method', 'method', ''),
                       ('prior', 'prior', '')]))


def _deployment_rows(method: Method, site: str, num: int, repeats: int,
                     res: Dict) -> List[Dict]:
    """The ``raw`` and ``fitted`` rows of one :func:`deployment_gains`
    result."""
    rows = []
    for prior in ('raw', 'fitted'):
        r = res[prior]
        rows.append(
            dict(
                site=site,
                method=method.name,
                prior=f'E_site({num}) {prior}',
                labelled=num,
                gain=r['mean'],
                low=r['low'],
                high=r['high'],
                interval=f'[{r["low"]:+.2f}, {r["high"]:+.2f}]',
                alpha=float(np.mean(res['alphas']))
                if prior == 'fitted' else None,
                repeats=repeats,
                gains=r['gains']))
    return rows


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
        accept (str): see :func:`fit_site_prior`.
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
            rows += _deployment_rows(m, site, num, repeats, res)
    markdown = markdown_table(rows, [('site', 'site', ''),
                                     ('method', 'method', ''),
                                     ('prior', 'prior', ''),
                                     ('gain', 'AP gain over E_t', '+.2f'),
                                     ('interval', '95 % interval (draws)', ''),
                                     ('alpha', 'mean alpha',
                                      '.2f')]) if rows else ''
    return ProtocolTable(rows, markdown)


def sweep_table(rows: Sequence[Dict]) -> List[Dict]:
    """The sweep's rows pivoted: one per (site, method), the AP gain of
    each alpha as a column ``alpha <a>``, ``AP_E_t`` and ``peak`` (the
    alpha of the largest AP).

    Args:
        rows (Sequence[dict]): :func:`sweep` rows.

    Returns:
        list[dict]: the pivoted rows.
    """
    table: Dict = {}
    for r in rows:
        row = table.setdefault((r['site'], r['method']),
                               dict(site=r['site'], method=r['method']))
        row[f'alpha {r["alpha"]:g}'] = r['gain']
        if r['alpha'] == 0:
            row['AP_E_t'] = r['AP']
        if 'peak' not in row or r['AP'] > row['_best']:
            row['peak'], row['_best'] = r['alpha'], r['AP']
    return [{
        k: v
        for k, v in row.items() if k != '_best'
    } for row in table.values()]


def sweep(methods: Sequence[Method],
          evaluator: CocoEvaluator,
          train_prior: np.ndarray,
          partitions: Partitions,
          site_priors: Dict[str, np.ndarray],
          alphas: Sequence[float] = SWEEP_ALPHAS) -> ProtocolTable:
    """Per site, the dense sweep ``E_t + alpha (E_site - E_t)``
    (:func:`shrinkage_sweep`): does the detector read the direction of
    the site's shift?

    Args:
        methods (Sequence[Method]): the detectors (those without a prior
            are left out).
        evaluator (CocoEvaluator): the images' annotations.
        train_prior (np.ndarray): E_t.
        partitions (dict): each site's image indices.
        site_priors (dict): E_site of each site.
        alphas (Sequence[float]): the points of the sweep.

    Returns:
        ProtocolTable: a row per (site, method, alpha); the Markdown is
        pivoted (:func:`sweep_table`), a column per alpha.
    """
    rows = [
        dict(row, site=site, method=m.name)
        for site, idx in partitions.items()
        for m in _takes_prior(methods) for row in shrinkage_sweep(
            m.rescorer, evaluator, train_prior, site_priors[site], idx, alphas)
    ]
    markdown = markdown_table(
        sweep_table(rows), [('site', 'site', ''), ('method', 'method', ''),
                            ('AP_E_t', 'AP(E_t)', '.2f')] +
        [(f'alpha {a:g}', f'alpha {a:g}', '+.2f')
         for a in alphas] + [('peak', 'peak at alpha', 'g')])
    return ProtocolTable(rows, markdown)


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
    markdown = _metric_table(rows, [('size', 'subset size', ''),
                                    ('num_subsets', 'subsets', ''),
                                    ('method', 'method', ''),
                                    ('prior', 'prior', ''),
                                    ('epsilon', 'epsilon',
                                     '.3f')]) if rows else ''
    return ProtocolTable(rows, markdown)


def _self_calibration_row(method: Method, evaluate: Callable, name: str,
                          idx: np.ndarray, res, radius: Optional[float],
                          score_thr: float, train_prior: np.ndarray,
                          site_prior: Optional[np.ndarray]) -> Dict:
    """The row of one self-calibration run (a partition, a method, a
    radius), with the AP of its first estimate E_i."""
    first, last = res.history[0]['AP'], res.history[-1]['AP']
    estimate = evaluate(method.cache,
                        method.rescorer.predict(res.start_estimate, idx),
                        idx)['AP']
    known = site_prior is not None
    return dict(
        site=name,
        method=method.name,
        score_thr=score_thr,
        radius=radius,
        epsilon=prior_mae(site_prior, train_prior) if known else None,
        AP_start=first,
        AP_end=last,
        gain=last - first,
        epsilon_end=prior_mae(site_prior, res.prior) if known else None,
        AP_estimate=estimate)


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
        iters, score_thr, tol, eta: see :func:`self_calibrate`.
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
    runs = {
        (m.name, radius):
        self_calibrate_partitions(
            m.rescorer.model,
            m.cache,
            parts,
            evaluate=evaluate,
            progress=progress,
            iters=iters,
            eta=eta,
            score_thr=score_thr,
            tol=tol,
            trust_radius=radius,
            init_prior=train_prior,
            init_support=m.rescorer.support_of(train_prior),
            correction=m.rescorer.correction,
            batch_size=batch_size)
        for m in _takes_prior(methods)
        for radius in _radii(radii)
    }
    by_name, curves, rows = {m.name: m for m in methods}, {}, []
    for i, name in enumerate(names):
        for (method, radius), run in runs.items():
            res = run['results'][i]
            label = '' if radius is None else f', radius {radius:g}'
            curves[f'{method}, {name}{label}'] = res.history
            rows.append(
                _self_calibration_row(by_name[method], evaluate, name,
                                      parts[i], res, radius, score_thr,
                                      train_prior, (site_priors
                                                    or {}).get(name)))
    markdown = markdown_table(rows,
                              [('site', 'site', ''), ('method', 'method', ''),
                               ('score_thr', 'score threshold', '.2f'),
                               ('radius', 'trust radius', 'g'),
                               ('epsilon', 'epsilon(E_site, E_t)', '.3f'),
                               ('AP_start', 'AP(E_t)', 'pct'),
                               ('AP_end', 'AP(E_c)', 'pct'),
                               ('gain', 'gain', 'gain'),
                               ('epsilon_end', 'epsilon(E_site, E_c)', '.3f'),
                               ('AP_estimate', 'AP(E_i)', 'pct')])
    return ProtocolTable(rows, markdown, dict(curves=curves, runs=runs))


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
                site_prior = (site_priors or {}).get(name)
                rows.append(
                    dict(
                        site=name,
                        method=m.name,
                        radius=radius,
                        **{
                            k: run[k]
                            for k in ('AP_start', 'AP_stream', 'gain',
                                      'updates')
                        },
                        epsilon_end=None if site_prior is None else prior_mae(
                            site_prior, run['prior'])))
    markdown = markdown_table(rows,
                              [('site', 'site', ''), ('method', 'method', ''),
                               ('radius', 'trust radius', 'g'),
                               ('updates', 'updates', ''),
                               ('AP_start', 'AP(E_t)', 'pct'),
                               ('AP_stream', 'AP streamed', 'pct'),
                               ('gain', 'gain', 'gain'),
                               ('epsilon_end', 'epsilon(E_site, E_c)', '.3f')])
    return ProtocolTable(rows, markdown)
