# Copyright (c) mmcalidet contributors. All rights reserved.
"""Compare two relation priors: MAE, percentiles, top changed pairs."""
from typing import Dict, List, Optional, Sequence

import numpy as np

#: the percentiles of |A - B| the paper reports for E_v vs E_t
PERCENTILES = (0, 50, 90, 97, 100)


def compare_priors(a: np.ndarray,
                   b: np.ndarray,
                   classes: Optional[Sequence[str]] = None,
                   top: int = 20,
                   percentiles: Sequence[float] = PERCENTILES) -> Dict:
    """Summarise how prior ``b`` differs from prior ``a``.

    Args:
        a, b (np.ndarray): K x K relation matrices in the same class order.
        classes (Sequence[str], optional): class names for the top pairs.
        top (int): number of most-changed pairs to list.
        percentiles (Sequence[float]): percentiles of ``|b - a|``.

    Returns:
        dict: ``mae`` (mean of |b - a| over all K^2 entries, the paper's
        epsilon), ``mae_offdiag``, ``percentiles`` ({p: value}) and
        ``top_pairs`` (list of dicts with i, j, names, a, b, delta), sorted
        by |delta| descending.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f'priors differ in shape: {a.shape} vs {b.shape}')
    k = a.shape[0]
    if classes is None:
        classes = [str(i) for i in range(k)]
    diff = b - a
    absdiff = np.abs(diff)
    offdiag = ~np.eye(k, dtype=bool)
    order = np.argsort(-absdiff, axis=None, kind='stable')
    pairs: List[Dict] = []
    for flat in order[:top]:
        i, j = divmod(int(flat), k)
        pairs.append(
            dict(i=i, j=j, class_i=classes[i], class_j=classes[j],
                 a=float(a[i, j]), b=float(b[i, j]), delta=float(diff[i, j])))
    return dict(
        num_classes=k,
        mae=float(absdiff.mean()),
        mae_offdiag=float(absdiff[offdiag].mean()) if k > 1 else 0.0,
        percentiles={
            str(p): float(v)
            for p, v in zip(percentiles, np.percentile(absdiff, percentiles))
        },
        top_pairs=pairs)


def format_comparison(summary: Dict, names: Sequence[str] = ('A', 'B'),
                      digits: int = 4) -> str:
    """Markdown report of :func:`compare_priors`'s summary.

    Args:
        summary (dict): the summary.
        names (Sequence[str]): the names of the two priors.
        digits (int): decimals shown.

    Returns:
        str: Markdown text.
    """
    a, b = names
    f = f'{{:.{digits}f}}'
    lines = [
        f'# {b} vs {a}', '',
        f'- K = {summary["num_classes"]}',
        f'- MAE = mean |{b} - {a}| over all K^2 entries: '
        + f.format(summary['mae']),
        '- MAE off the diagonal: ' + f.format(summary['mae_offdiag']),
        '', '| percentile of abs diff | ' +
        ' | '.join(summary['percentiles']) + ' |',
        '|---|' + '---|' * len(summary['percentiles']),
        '| value | ' + ' | '.join(
            f.format(v) for v in summary['percentiles'].values()) + ' |',
        '', f'## Top {len(summary["top_pairs"])} changed pairs', '',
        f'| P(i \\| j) | {a} | {b} | {b} - {a} |', '|---|---|---|---|'
    ]
    for p in summary['top_pairs']:
        lines.append(
            f'| P({p["class_i"]} \\| {p["class_j"]}) | ' +
            f'{f.format(p["a"])} | {f.format(p["b"])} | '
            f'{p["delta"]:+.{digits}f} |')
    return '\n'.join(lines) + '\n'
