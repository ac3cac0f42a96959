# Copyright (c) mmcalidet contributors. All rights reserved.
"""Plots of the evaluation protocol: self-calibration curves (the paper's
Fig. 5-10: AP, step MAE and step MAX per iteration), the prior sweep and
the subset evaluation."""
import math
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from .prior_heatmap import _pyplot, _save

History = List[Dict]


def _as_curves(curves: Union[History, Dict[str, History]]) -> Dict:
    if isinstance(curves, dict):
        return curves
    return {'': curves}


def _zoom(ax, values: Sequence[float], margin: float = 2.0) -> None:
    """Limit the y axis to the plotted values (bars of AP 70-80 that differ
    by a point are unreadable from 0); never below 0."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    pad = max(margin, 0.25 * (hi - lo))
    ax.set_ylim(max(0.0, lo - pad), hi + pad)


def _series(history: History, key: str, scale: float = 1.0):
    """Iterations and values of ``key`` where it is a finite number."""
    pts = [(r['iter'], scale * r[key]) for r in history
           if r.get(key) is not None and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_self_calibration(curves: Union[History, Dict[str, History]],
                          path: str,
                          title: str = 'Self-calibration',
                          metric: str = 'AP') -> str:
    """Write the self-calibration curves: ``metric`` (x 100), step MAE and
    step MAX (log scale) against the iteration.

    Args:
        curves (list[dict] | dict[str, list[dict]]): one history (records
            with ``iter``, ``step_mae``, ``step_max`` and optionally the
            metric) or several by legend label.
        path (str): the PNG (written atomically).
        title (str): the figure title.
        metric (str): the metric of the first panel.

    Returns:
        str: the path.
    """
    plt = _pyplot()
    curves = _as_curves(curves)
    has_metric = any(
        any(metric in r and r[metric] is not None for r in h)
        for h in curves.values())
    panels = ([(metric, f'{metric} (x100)', 100.0)] if has_metric else []) \
        + [('step_mae', 'Step MAE', 1.0), ('step_max', 'Step MAX', 1.0)]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels):
        for name, history in curves.items():
            if key != metric:  # iteration 0 has no step
                history = [r for r in history if r['iter'] > 0]
            its, vals = _series(history, key, scale)
            ax.plot(its, vals, marker='o', markersize=3, label=name or None)
        ax.set_xlabel('iteration')
        ax.set_ylabel(label)
        ax.set_title(label)
        if key != metric:
            positive = [
                v for h in curves.values()
                for v in _series([r for r in h if r['iter'] > 0], key)[1]
                if v > 0
            ]
            if positive:
                ax.set_yscale('log')
        ax.grid(alpha=0.3)
    if any(curves):
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _grouped_bars(ax, groups: Sequence[str], series: Sequence[str],
                  value: Dict) -> List[float]:
    """Draw one bar per (group, series), grouped along x by ``groups``.

    Args:
        ax: the matplotlib axes.
        groups (Sequence[str]): the x groups, in order.
        series (Sequence[str]): the bars of each group (legend entries).
        value (dict): ``(group, series) -> fraction`` (missing or ``None``:
            no bar).

    Returns:
        list[float]: the drawn values (x100, ``nan`` for missing ones).
    """
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    drawn: List[float] = []
    for j, name in enumerate(series):
        vals = [value.get((g, name)) for g in groups]
        vals = [100 * v if v is not None else np.nan for v in vals]
        drawn += vals
        ax.bar(
            x + (j - (len(series) - 1) / 2) * width, vals, width, label=name)
    ax.set_xticks(x)
    return drawn


def plot_prior_sweep(rows: Sequence[Dict],
                     path: str,
                     metric: str = 'AP',
                     title: str = 'AP under injected priors') -> str:
    """Write a grouped bar chart of a metric per prior and method (the
    rows of :func:`mmcalidet.evaluation.evaluate_priors`).

    Args:
        rows (Sequence[dict]): rows with ``method``, ``prior`` and the
            metric (a fraction).
        path (str): the PNG.
        metric (str): the metric.
        title (str): the title.

    Returns:
        str: the path.
    """
    plt = _pyplot()
    priors: List[str] = []
    methods: List[str] = []
    flat = [r for r in rows if r['prior'] == '-']  # no prior: a line
    rows = [r for r in rows if r['prior'] != '-']
    for r in rows:
        if r['prior'] not in priors:
            priors.append(r['prior'])
        if r['method'] not in methods:
            methods.append(r['method'])
    value = {(r['prior'], r['method']): r.get(metric) for r in rows}
    fig, ax = plt.subplots(figsize=(1.2 * len(priors) + 3, 3.8))
    _grouped_bars(ax, priors, methods, value)
    for r in flat:
        if r.get(metric) is not None and not math.isnan(r[metric]):
            ax.axhline(
                100 * r[metric],
                ls='--',
                lw=1.2,
                color='k',
                label=f'{r["method"]} (no prior)')
    _zoom(ax, [100 * v for v in value.values() if v is not None] +
          [100 * r[metric] for r in flat if r.get(metric) is not None])
    ax.set_xticklabels(priors)
    ax.set_ylabel(f'{metric} (x100)')
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis='y', alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_subset_results(rows: Sequence[Dict],
                        path: str,
                        metric: str = 'AP',
                        epsilon_rows: Optional[Sequence[Dict]] = None,
                        title: str = 'Subset evaluation') -> str:
    """Write epsilon and the E_b - E_t gain against the subset size.

    Args:
        rows (Sequence[dict]): rows of
            :func:`mmcalidet.evaluation.evaluate_subsets` (may be empty).
        path (str): the PNG.
        metric (str): the metric of the gain panel.
        epsilon_rows (Sequence[dict], optional): rows of
            :func:`mmcalidet.evaluation.subset_epsilon` (used when
            ``rows`` have no E_b rows).
        title (str): the title.

    Returns:
        str: the path.
    """
    plt = _pyplot()
    eb = [r for r in rows if r.get('prior') == 'E_b']
    eps_src = eb if eb else list(epsilon_rows or [])
    gain_key = f'gain_{metric}'
    has_gain = any(gain_key in r for r in eb)
    fig, axes = plt.subplots(
        1,
        2 if has_gain else 1,
        figsize=(9 if has_gain else 4.6, 3.6),
        squeeze=False)
    ax = axes[0][0]
    by_method: Dict[str, List] = {}
    for r in eps_src:
        by_method.setdefault(r.get('method', ''), []).append(r)
    for name, rs in by_method.items():
        rs = [
            r for r in rs
            if r.get('epsilon') is not None and not math.isnan(r['epsilon'])
        ]
        ax.plot([r['size'] for r in rs], [r['epsilon'] for r in rs],
                marker='o',
                label=name or None)
        break  # epsilon depends on the labels only
    ax.set_xscale('log', base=2)
    ax.set_xlabel('subset size')
    ax.set_ylabel('epsilon = MAE(E_b, E_t)')
    ax.set_title('epsilon')
    ax.grid(alpha=0.3)
    if has_gain:
        ax = axes[0][1]
        methods: Dict[str, List] = {}
        for r in eb:
            methods.setdefault(r['method'], []).append(r)
        for name, rs in methods.items():
            ax.plot([r['size'] for r in rs], [100 * r[gain_key] for r in rs],
                    marker='o',
                    label=name)
        ax.axhline(0, color='k', lw=0.8)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('subset size')
        ax.set_ylabel(f'{metric}(E_b) - {metric}(E_t) (x100)')
        ax.set_title('gain of E_b')
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    sizes = sorted({r['size'] for r in list(eps_src) + eb})
    for ax in axes[0]:
        if sizes:
            ax.set_xticks(sizes)
            ax.set_xticklabels([str(s) for s in sizes])
            ax.minorticks_off()
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_site_results(
        rows: Sequence[Dict],
        path: str,
        metric: str = 'AP',
        title: str = 'Deployment sites: E_t vs the site prior') -> str:
    """Write a grouped bar chart of a metric per site and method / prior
    (the rows of :func:`mmcalidet.evaluation.evaluate_groups`),
    labelled with each site's epsilon.

    Args:
        rows (Sequence[dict]): rows with ``site``, ``epsilon``, ``method``,
            ``prior`` and the metric (a fraction).
        path (str): the PNG.
        metric (str): the metric.
        title (str): the title.

    Returns:
        str: the path.
    """
    plt = _pyplot()

    def series(r):
        return r['method'] + ('' if r['prior'] == '-' else f' ({r["prior"]})')

    sites = list(dict.fromkeys(r['site'] for r in rows))
    names = list(dict.fromkeys(series(r) for r in rows))
    value = {(r['site'], series(r)): r.get(metric) for r in rows}
    eps = {r['site']: r['epsilon'] for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.0, 2.4 * len(sites)), 4.2))
    _zoom(ax, _grouped_bars(ax, sites, names, value))
    ax.set_xticklabels([f'{s}\nepsilon {eps[s]:.3f}' for s in sites])
    ax.set_ylabel(f'{metric} (x100)')
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis='y', alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_shrinkage_sweep(
        rows: Sequence[Dict],
        path: str,
        title: str = 'AP gain over E_t along E_t + alpha (E_site - E_t)'
) -> str:
    """Write one panel per method of the AP gain along a site's shrinkage
    sweep, a line per site (the rows of :func:`mmcalidet.evaluation.
    shrinkage_sweep` with ``site`` and ``method`` added). A detector that
    reads the relations rises toward alpha = 1 on a site whose own
    statistics help and falls along negative alpha.

    Args:
        rows (Sequence[dict]): rows with ``site``, ``method``, ``alpha``
            and ``gain`` (AP points).
        path (str): the PNG.
        title (str): the title.

    Returns:
        str: the path.
    """
    plt = _pyplot()
    methods = list(dict.fromkeys(r['method'] for r in rows))
    sites = list(dict.fromkeys(r['site'] for r in rows))
    fig, axes = plt.subplots(
        1,
        max(1, len(methods)),
        figsize=(4.6 * max(1, len(methods)), 3.8),
        sharey=True,
        squeeze=False)
    for ax, method in zip(axes[0], methods):
        for site in sites:
            pts = sorted((r['alpha'], r['gain']) for r in rows
                         if r['method'] == method and r['site'] == site)
            ax.plot([p[0] for p in pts], [p[1] for p in pts],
                    marker='o',
                    label=site)
        ax.axhline(0.0, color='grey', lw=0.8)
        ax.axvline(1.0, color='grey', lw=0.8, ls=':')
        ax.set_xlabel('alpha (0: E_t, 1: E_site)')
        ax.set_title(method, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('AP gain over E_t (points)')
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)
