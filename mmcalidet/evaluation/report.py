# Copyright (c) mmcalidet contributors. All rights reserved.
"""Tables of evaluation results: Markdown for people, JSON for scripts;
the layout of each table of :mod:`mmcalidet.evaluation.protocol`."""
import json
import math
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..priors import prior_mae
from ..utils.file_io import atomic_write

#: (key, header, format) of a column; format is a ``str.format`` spec
Column = Tuple[str, str, str]


def fmt_value(value: Any, spec: str = '') -> str:
    """Format one cell; ``None``/``nan`` give ``-``."""
    if value is None:
        return '-'
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return '-'
    if spec == 'pct':  # a fraction shown x 100 with two decimals
        return f'{100 * value:.2f}'
    if spec == 'gain':
        return f'{100 * value:+.2f}'
    return format(value, spec) if spec else str(value)


def markdown_table(rows: Sequence[Dict], columns: Sequence[Column]) -> str:
    """A Markdown table of ``rows`` with the given columns."""
    lines = [
        '| ' + ' | '.join(h for _, h, _ in columns) + ' |',
        '|' + '|'.join('---' for _ in columns) + '|'
    ]
    for row in rows:
        lines.append('| ' + ' | '.join(
            fmt_value(row.get(k), spec) for k, _, spec in columns) + ' |')
    return '\n'.join(lines)


def metric_columns(spec: str = 'pct') -> List[Column]:
    """Table columns of the COCO metrics."""
    from .coco import METRICS
    return [(m, m, spec) for m in METRICS]


def injection_table(rows: Sequence[Dict]) -> str:
    """The injection table of :func:`~mmcalidet.evaluation.evaluate_priors`
    rows: method, prior, oracle and the COCO metrics."""
    return markdown_table(
        [dict(r, oracle='yes' if r['oracle'] else '') for r in rows],
        [('method', 'method', ''), ('prior', 'prior', ''),
         ('oracle', 'oracle', '')] + metric_columns())


def format_order_verdict(order: Dict) -> str:
    """One line of a :func:`check_expected_order` result: the verdict, the
    violations when it does not hold, and the spread when it holds."""
    verdict = order['verdict']
    if order['holds'] is False:
        verdict += ': ' + '; '.join(order['violations'])
    elif order['holds']:
        verdict += f' (spread {100 * order["spread"]:.2f})'
    return verdict


def order_lines(orders: Dict[str, Dict], prefix: str = '- ') -> List[str]:
    """One Markdown line per method: ``<prefix><method>: a <= b ...:
    **verdict**``.

    Args:
        orders (dict): method name -> its
            :func:`~mmcalidet.evaluation.check_expected_order` result.
        prefix (str): what starts each line.

    Returns:
        list[str]: the lines.
    """
    return [
        f'{prefix}{method}: {" <= ".join(order["order"])}: '
        f'**{format_order_verdict(order)}**'
        for method, order in orders.items()
    ]


def _with_metrics(rows: Sequence[Dict], keys: Sequence[Column]) -> str:
    """``keys``, the COCO metrics and the AP gain."""
    return markdown_table(
        rows,
        list(keys) + metric_columns() + [('gain_AP', 'AP gain', 'gain')])


def fmt_interval(interval: Optional[Sequence[float]],
                 spec: str = 'gain') -> str:
    """``[lo, hi]`` of an interval (``-`` without one)."""
    if interval is None or any(v is None or v != v for v in interval):
        return '-'
    return '[' + ', '.join(fmt_value(v, spec) for v in interval) + ']'


def site_table(rows: Sequence[Dict]) -> str:
    """The per-site table: E_t against each site's own statistics
    (``E_site``: split-half; ``E_site(in-sample)``: the images the prior
    was measured on), each gain with its 90 % interval."""
    return markdown_table(
        [dict(r, interval=fmt_interval(r.get('interval')))
         for r in rows], [('site', 'site', ''), ('num_images', 'images', ''),
                          ('epsilon', 'epsilon', '.3f'),
                          ('method', 'method', ''), ('prior', 'prior', '')] +
        metric_columns() + [('gain_AP', 'AP gain', 'gain'),
                            ('interval', '90 % interval', '')])


def site_summary_table(means: Sequence[Dict], rows: Sequence[Dict]) -> str:
    """The mean gain over sites per (method, prior) and, per split-half
    row with relation-only classes, the AP gain over those classes."""
    lines = markdown_table([
        dict(
            m, interval=fmt_interval(m['interval']), num_sites=len(m['sites']))
        for m in means
    ], [('method', 'method', ''), ('prior', 'prior', ''),
        ('num_sites', 'sites', ''), ('gain_AP', 'mean AP gain', 'gain'),
        ('interval', '90 % interval', '')])
    rel = [
        dict(
            r,
            interval=fmt_interval(r['relation_interval']),
            classes=', '.join(r['relation_classes']) or '-') for r in rows
        if 'relation_classes' in r
    ]
    if rel:
        lines += '\n\n' + markdown_table(
            rel, [('site', 'site', ''), ('method', 'method', ''),
                  ('classes', 'relation-only classes', ''),
                  ('relation_gain_AP', 'AP gain over them', 'gain'),
                  ('interval', '90 % interval', '')])
    return lines


def subset_table(rows: Sequence[Dict]) -> str:
    """The subset table (the paper's Tab. 3 layout); '' without rows."""
    return _with_metrics(rows, [('size', 'subset size', ''),
                                ('num_subsets', 'subsets', ''),
                                ('method', 'method', ''),
                                ('prior', 'prior', ''),
                                ('epsilon', 'epsilon', '.3f')]) if rows else ''


def deployment_table(rows: Sequence[Dict]) -> str:
    """The deployment table: per site, method and labelled count, the
    raw and the fitted site prior's AP gain over E_t; '' without rows."""
    return markdown_table(rows, [('site', 'site', ''),
                                 ('method', 'method', ''),
                                 ('prior', 'prior', ''),
                                 ('gain', 'AP gain over E_t', '+.2f'),
                                 ('interval', '95 % interval (draws)', ''),
                                 ('alpha', 'mean alpha',
                                  '.2f')]) if rows else ''


def deployment_rows(method: str, site: str, num: int, repeats: int,
                    res: Dict) -> List[Dict]:
    """The ``raw`` and ``fitted`` rows of one
    :func:`~mmcalidet.calibration.deployment_gains` result.

    Args:
        method (str): the method's name.
        site (str): the site's.
        num (int): the labelled images of a draw.
        repeats (int): the draws.
        res (dict): the result.

    Returns:
        list[dict]: the two rows (``gain``, ``low``, ``high``,
        ``interval``, ``alpha``, ...).
    """
    rows = []
    for prior in ('raw', 'fitted'):
        r = res[prior]
        rows.append(
            dict(
                site=site,
                method=method,
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


def sweep_table(rows: Sequence[Dict]) -> List[Dict]:
    """The sweep's rows pivoted: one per (site, method, prior), the AP
    gain of each alpha as a column ``alpha <a>`` (its interval as
    ``interval <a>``), ``AP_E_t`` and ``peak`` (the alpha of the largest
    AP).

    Args:
        rows (Sequence[dict]): :func:`~mmcalidet.evaluation.protocol.sweep`
            rows.

    Returns:
        list[dict]: the pivoted rows.
    """
    table: Dict = {}
    for r in rows:
        prior = r.get('prior', '-')
        row = table.setdefault(
            (r['site'], r['method'], prior),
            dict(site=r['site'], method=r['method'], prior=prior))
        row[f'alpha {r["alpha"]:g}'] = r['gain']
        if r.get('interval') is not None:
            row[f'interval {r["alpha"]:g}'] = r['interval']
        if r['alpha'] == 0:
            row['AP_E_t'] = r['AP']
        if 'peak' not in row or r['AP'] > row['_best']:
            row['peak'], row['_best'] = r['alpha'], r['AP']
    return [{
        k: v
        for k, v in row.items() if k != '_best'
    } for row in table.values()]


def sweep_markdown(rows: Sequence[Dict], alphas: Sequence[float]) -> str:
    """The sweep pivoted (:func:`sweep_table`), a column per alpha (the
    gain and its 90 % interval)."""
    cells = []
    for r in sweep_table(rows):
        cell = dict(r)
        for a in alphas:
            gain = r.get(f'alpha {a:g}')
            if gain is not None and a != 0:
                cell[f'alpha {a:g}'] = f'{gain:+.2f} ' + fmt_interval(
                    r.get(f'interval {a:g}'), '+.2f')
        cells.append(cell)
    return markdown_table(cells, [('site', 'site', ''),
                                  ('method', 'method', ''),
                                  ('prior', 'prior', ''),
                                  ('AP_E_t', 'AP(E_t)', '.2f')] +
                          [(f'alpha {a:g}', f'alpha {a:g}', '+.2f')
                           for a in alphas] + [('peak', 'peak at alpha', 'g')])


def self_calibration_table(rows: Sequence[Dict]) -> str:
    """Self-calibration per partition, method and trust radius."""
    return markdown_table(rows,
                          [('site', 'site', ''), ('method', 'method', ''),
                           ('score_thr', 'score threshold', '.2f'),
                           ('radius', 'trust radius', 'g'),
                           ('epsilon', 'epsilon(E_site, E_t)', '.3f'),
                           ('AP_start', 'AP(E_t)', 'pct'),
                           ('AP_end', 'AP(E_c)', 'pct'),
                           ('gain', 'gain', 'gain'),
                           ('epsilon_end', 'epsilon(E_site, E_c)', '.3f'),
                           ('AP_estimate', 'AP(E_i)', 'pct')])


def online_table(rows: Sequence[Dict]) -> str:
    """Online self-calibration per trust radius, method and partition."""
    return markdown_table(rows,
                          [('site', 'site', ''), ('method', 'method', ''),
                           ('radius', 'trust radius', 'g'),
                           ('updates', 'updates', ''),
                           ('AP_start', 'AP(E_t)', 'pct'),
                           ('AP_stream', 'AP streamed', 'pct'),
                           ('gain', 'gain', 'gain'),
                           ('epsilon_end', 'epsilon(E_site, E_c)', '.3f')])


def self_calibration_row(site: str, method: str, score_thr: float,
                         radius: Optional[float], res, estimate_ap: float,
                         train_prior: np.ndarray,
                         site_prior: Optional[np.ndarray]) -> Dict:
    """The row of one self-calibration run (a partition, a method, a
    radius).

    Args:
        site (str): the partition's name.
        method (str): the method's.
        score_thr (float): the run's score threshold.
        radius (float, optional): its trust radius.
        res (SelfCalibrationResult): its result (``history`` with ``AP``).
        estimate_ap (float): the AP of its first estimate E_i.
        train_prior (np.ndarray): E_t.
        site_prior (np.ndarray, optional): the partition's own statistics
            (the epsilon columns; ``None``: ``-``).

    Returns:
        dict: the row.
    """
    first, last = res.history[0]['AP'], res.history[-1]['AP']
    known = site_prior is not None
    return dict(
        site=site,
        method=method,
        score_thr=score_thr,
        radius=radius,
        epsilon=prior_mae(site_prior, train_prior) if known else None,
        AP_start=first,
        AP_end=last,
        gain=last - first,
        epsilon_end=prior_mae(site_prior, res.prior) if known else None,
        AP_estimate=estimate_ap)


def online_row(site: str, method: str, radius: Optional[float], run: Dict,
               site_prior: Optional[np.ndarray]) -> Dict:
    """The row of one streamed partition.

    Args:
        site (str): the partition's name.
        method (str): the method's.
        radius (float, optional): the calibrator's trust radius.
        run (dict): :func:`~mmcalidet.calibration.stream_site`'s result.
        site_prior (np.ndarray, optional): the partition's own statistics
            (``epsilon_end``; ``None``: ``-``).

    Returns:
        dict: the row.
    """
    return dict(
        site=site,
        method=method,
        radius=radius,
        **{k: run[k]
           for k in ('AP_start', 'AP_stream', 'gain', 'updates')},
        epsilon_end=None if site_prior is None else prior_mae(
            site_prior, run['prior']))


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, 'item') and getattr(obj, 'ndim', 1) == 0:
        return _json_safe(obj.item())
    if hasattr(obj, 'tolist'):
        return _json_safe(obj.tolist())
    return obj


def write_report(out_dir: str, stem: str, title: str,
                 sections: Sequence[Tuple[Optional[str], str]],
                 data: Dict[str, Any]) -> List[str]:
    """Write ``<stem>.md`` and ``<stem>.json`` atomically.

    Args:
        out_dir (str): the folder (created).
        stem (str): file name without extension.
        title (str): the Markdown title.
        sections (Sequence[tuple]): ``(heading or None, markdown text)``.
        data (dict): the JSON content (nan becomes ``null``).

    Returns:
        list[str]: the two paths.
    """
    md = [f'# {title}', '']
    for heading, text in sections:
        if heading:
            md += [f'## {heading}', '']
        md += [text.rstrip(), '']
    md_path = osp.join(out_dir, f'{stem}.md')
    json_path = osp.join(out_dir, f'{stem}.json')
    with atomic_write(md_path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(md))
    with atomic_write(json_path, 'w', encoding='utf-8') as f:
        json.dump(_json_safe(data), f, indent=1, allow_nan=False)
        f.write('\n')
    return [md_path, json_path]
