# Copyright (c) mmcalidet contributors. All rights reserved.
"""Several calibrator trainings (seeds) on the same cached DINO: each
row's gain over the seeds, its mean and range (``benchmark.py
--calibrator-seeds``). One training is one draw of the calibrator's
run-to-run spread; a recipe's gain reads against that range."""
from typing import Dict, List, Sequence

import numpy as np

from mmcalidet.evaluation.report import markdown_table

#: (results key, the row's key fields, its gain field, gain scale to points)
TABLES = (
    ('sites', ('site', 'method', 'prior'), 'gain_AP', 100.0),
    ('site_means', ('method', 'prior'), 'gain_AP', 100.0),
    ('sweep', ('site', 'method', 'prior', 'alpha'), 'gain', 1.0),
)


def seed_rows(per_seed: Dict[int, Dict]) -> List[Dict]:
    """Per row of the site, mean-over-sites and sweep tables, its gain
    (AP points) under each calibrator seed, their mean and range.

    Args:
        per_seed (dict): calibrator seed -> :func:`evaluate_all`'s result.

    Returns:
        list[dict]: ``table``, the row's key fields, ``gains`` (one per
        seed, in seed order), ``mean``, ``low`` and ``high``; rows that do
        not vary with the calibrator (the plain DINO's) are kept.
    """
    if not per_seed:
        raise ValueError('no calibrator seed')
    seeds = list(per_seed)
    out = []
    for table, keys, field, scale in TABLES:
        gains: Dict[tuple, List[float]] = {}
        for seed in seeds:
            for r in per_seed[seed].get(table, ()):
                if field in r:
                    key = tuple(r[k] for k in keys)
                    gains.setdefault(key, []).append(scale * r[field])
        for key, values in gains.items():
            if len(values) != len(seeds):
                raise ValueError(f'{table} row {key} is missing under some '
                                 'calibrator seeds')
            v = np.asarray(values, dtype=np.float64)
            out.append(
                dict(
                    table=table,
                    **dict(zip(keys, key)),
                    gains=values,
                    mean=float(np.mean(v)),
                    low=float(np.min(v)),
                    high=float(np.max(v))))
    return out


def seed_markdown(rows: Sequence[Dict], seeds: Sequence[int]) -> str:
    """The site and mean-over-sites rows of :func:`seed_rows` (the sweep's
    stay in the JSON): mean and range of the gain over the seeds."""
    shown = [
        dict(
            r,
            where=r.get('site', 'mean over sites'),
            range=f'[{r["low"]:+.2f}, {r["high"]:+.2f}]',
            each=' / '.join(f'{g:+.2f}' for g in r['gains'])) for r in rows
        if r['table'] in ('sites', 'site_means')
    ]
    return markdown_table(
        shown, [('where', 'site', ''), ('method', 'method', ''),
                ('prior', 'prior', ''), ('mean', 'mean AP gain', '+.2f'),
                ('range', 'range over seeds', ''),
                ('each', 'seeds ' + ' / '.join(str(s) for s in seeds), '')])
