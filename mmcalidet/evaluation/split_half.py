# Copyright (c) mmcalidet contributors. All rights reserved.
"""Site tables whose statistics are measured on images other than those
scored (split-half), each gain with a paired-bootstrap interval.

A site's images (in cache order) split by parity into two fixed halves;
each half is scored under the *other* half's statistics E_site (with that
half prior's support, for a CaliFormer that reads one) and against E_t on
its own images; each half is its own AP (never the union of both, whose
scores two priors shifted), and the row's gain is the mean of the halves'
gains. The bootstrap resamples images within each half and averages the
halves' gains per resample (:func:`~.bootstrap.paired_bootstrap` with
``strata``). The in-sample rows (the prior measured on the images it
scores: the paper's subset protocol, Sec. 4.3) are named
:data:`IN_SAMPLE`.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..models.layers.support_ops import label_support
from ..priors import batch_prior, prior_mae
from ..utils.validation import check_float
from .bootstrap import paired_bootstrap, percentile_interval
from .coco import METRICS, CocoEvaluator, cache_evaluator
from .sweep import Method

#: the prior name of the split-half rows (each half under the other's)
SPLIT_HALF = 'E_site'
#: the prior name of the in-sample rows (the site's own images)
IN_SAMPLE = 'E_site(in-sample)'
#: the coverage of every site, sweep and headroom interval
INTERVAL_LEVEL = 0.9
#: bootstrap resamples of each gain
RESAMPLES = 1000
#: relation-only classes: site marginal within this share of training's
RELATION_TOLERANCE = 0.25


def split_halves(indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """A site's two fixed halves: its images at even and at odd positions
    (in the order given, e.g. cache order).

    Args:
        indices (Sequence[int]): the site's image indices.

    Returns:
        tuple[np.ndarray, np.ndarray]: the two halves.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(idx) < 2:
        raise ValueError(f'a split-half site needs at least 2 images, got '
                         f'{len(idx)}')
    return idx[0::2], idx[1::2]


@dataclass
class SiteHalves:
    """A site's halves and each half's own statistics.

    Attributes:
        halves (tuple): the two halves' image indices.
        priors (tuple): E of each half's ground-truth labels.
        supports (tuple): ``(n, shares)`` of each half (the support a
            support-aware CaliFormer reads with that half's prior).
    """
    halves: Tuple[np.ndarray, np.ndarray]
    priors: Tuple[np.ndarray, np.ndarray]
    supports: Tuple[Tuple[np.ndarray, np.ndarray], ...]

    def scoring(self, half: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(images, prior)``: half ``half`` under the other's prior."""
        return self.halves[half], self.priors[1 - half]


def site_halves(label_lists: Sequence[np.ndarray], indices: Sequence[int],
                num_classes: int) -> SiteHalves:
    """:func:`split_halves` of a site with each half's statistics.

    Args:
        label_lists (Sequence[np.ndarray]): class indices per cached image.
        indices (Sequence[int]): the site's images.
        num_classes (int): K.

    Returns:
        SiteHalves: the halves.
    """
    halves = split_halves(indices)
    lists = [[label_lists[i] for i in h] for h in halves]
    return SiteHalves(halves,
                      tuple(batch_prior(num_classes, x) for x in lists),
                      tuple(label_support(x, num_classes) for x in lists))


def register_half_supports(rescorer, halves: SiteHalves) -> None:
    """Tell a support-aware scorer what each half prior was measured on
    (without it the half prior reads like E0); a no-op for a model that
    reads no support."""
    if getattr(rescorer, 'reads_support', False):
        for prior, (n, share) in zip(halves.priors, halves.supports):
            rescorer.register_support(prior, n, share)


def scored_matches(rescorer, evaluator: CocoEvaluator,
                   parts: Sequence[Tuple[np.ndarray, np.ndarray]]):
    """The matches of several image sets, each under its own prior, in one
    :class:`~.image_matches.ImageMatches` (their AP is never taken
    together: each part is a stratum).

    Args:
        rescorer (Rescorer): the method's scorer.
        evaluator (CocoEvaluator): the annotations.
        parts (Sequence[tuple]): ``(image indices, prior)`` per part.

    Returns:
        tuple: the matches, each part's positions in them, each part's
        predictions.
    """
    img_ids = rescorer.cache.img_ids()
    ids, preds, strata, start = [], [], [], 0
    for idx, prior in parts:
        preds.append(rescorer.predict(prior, idx))
        ids += [img_ids[i] for i in idx]
        strata.append(np.arange(start, start + len(idx)))
        start += len(idx)
    flat = [p for part in preds for p in part]
    return evaluator.image_matches(ids, flat), strata, preds


def gain_of(own,
            base,
            strata=None,
            resamples: int = RESAMPLES,
            seed: int = 0,
            level: float = INTERVAL_LEVEL) -> Dict:
    """The AP gain (points) of ``own`` over ``base`` matches with its
    paired-bootstrap interval (``strata``: each its own AP, averaged).

    Returns:
        dict: ``gain``, ``interval`` ([lo, hi], points) and ``diffs``
        (each resample's gain).
    """
    boot = paired_bootstrap(
        own, base, resamples, seed, level, strata, keep_diffs=True)
    return dict(
        gain=boot['diff'],
        interval=[boot['low'], boot['high']],
        diffs=boot['diffs'])


def relation_classes(shares: np.ndarray,
                     train_shares: np.ndarray,
                     tolerance: float = RELATION_TOLERANCE) -> List[int]:
    """The classes whose site marginal lies within ``tolerance`` (a share)
    of training's: what is left to gain there is relations, not
    presence.

    Args:
        shares (np.ndarray): (K,) each class's image share at the site.
        train_shares (np.ndarray): (K,) its share in training.
        tolerance (float): e.g. 0.25 for +-25 %.

    Returns:
        list[int]: the class indices.
    """
    check_float('tolerance', tolerance, 0)
    shares = np.asarray(shares, np.float64)
    train = np.asarray(train_shares, np.float64)
    if shares.shape != train.shape:
        raise ValueError(f'{shares.shape} site shares for {train.shape} '
                         'training shares')
    keep = (train > 0) & (np.abs(shares - train) <= tolerance * train)
    return [int(c) for c in np.flatnonzero(keep)]


def _mean_metrics(per_half: Sequence[Dict]) -> Dict[str, float]:
    out = {}
    for m in METRICS:
        vals = np.array([r[m] for r in per_half], dtype=np.float64)
        out[m] = float(np.nanmean(vals)) if np.isfinite(vals).any() \
            else float('nan')
    return out


def _fraction(res: Dict) -> List[float]:
    """The interval of :func:`gain_of` (points) as fractions."""
    return [v / 100 for v in res['interval']]


def site_rows(method: Method,
              evaluator: CocoEvaluator,
              train_prior: np.ndarray,
              site_prior: np.ndarray,
              halves: SiteHalves,
              relation: Optional[Sequence[int]] = None,
              in_sample: bool = True,
              **boot) -> Tuple[List[Dict], Dict]:
    """One method's rows on one site: E_t, E_site(in-sample) and the
    split-half E_site (gains as fractions, like the metrics; ``interval``
    in the same units).

    Args:
        method (Method): the detector (it takes a prior).
        evaluator (CocoEvaluator): the annotations.
        train_prior (np.ndarray): E_t.
        site_prior (np.ndarray): the whole site's statistics (in-sample).
        halves (SiteHalves): the site's halves.
        relation (Sequence[int], optional): relation-only classes.
        in_sample (bool): also the in-sample row.
        **boot: ``resamples``, ``seed``, ``level`` of the bootstrap.

    Returns:
        tuple: the rows and each row's resampled gains (prior -> array).
    """
    r, evaluate = method.rescorer, cache_evaluator(evaluator)
    register_half_supports(r, halves)
    h0, h1 = halves.halves
    site = np.concatenate([h0, h1])
    base, _, base_preds = scored_matches(r, evaluator, [(site, train_prior)])
    strata = [np.arange(len(h0)), len(h0) + np.arange(len(h1))]
    rows, diffs = [
        dict(prior='E_t', **evaluate(r.cache, base_preds[0], site))
    ], {}
    if in_sample:
        own, _, preds = scored_matches(r, evaluator, [(site, site_prior)])
        res = gain_of(own, base, **boot)
        metrics = evaluate(r.cache, preds[0], site)
        rows.append(
            dict(
                prior=IN_SAMPLE,
                **metrics,
                **{f'gain_{m}': metrics[m] - rows[0][m]
                   for m in METRICS},
                interval=_fraction(res)))
        diffs[IN_SAMPLE] = res['diffs']
    own, _, preds = scored_matches(
        r, evaluator, [halves.scoring(0), halves.scoring(1)])
    res = gain_of(own, base, strata, **boot)
    # E_t's predictions of the site, in the halves' order, cut in two
    cut = [base_preds[0][:len(h0)], base_preds[0][len(h0):]]
    per_half = [
        dict(
            own=evaluate(r.cache, preds[h], halves.halves[h]),
            base=evaluate(r.cache, cut[h], halves.halves[h])) for h in (0, 1)
    ]
    metrics = _mean_metrics([p['own'] for p in per_half])
    base_mean = _mean_metrics([p['base'] for p in per_half])
    row = dict(
        prior=SPLIT_HALF,
        **metrics,
        **{f'gain_{m}': metrics[m] - base_mean[m]
           for m in METRICS},
        AP_E_t=base_mean['AP'],
        interval=_fraction(res),
        halves=[
            dict(
                num_images=len(halves.halves[h]),
                AP_E_t=per_half[h]['base']['AP'],
                AP=per_half[h]['own']['AP'],
                epsilon=prior_mae(halves.priors[1 - h], train_prior))
            for h in (0, 1)
        ])
    diffs[SPLIT_HALF] = res['diffs']
    if relation is not None:
        cats = [evaluator.cat_ids[c] for c in relation]
        rel = gain_of(
            own.of_categories(cats), base.of_categories(cats), strata, **
            boot) if cats else dict(
                gain=float('nan'), interval=[float('nan')] * 2)
        row.update(
            relation_classes=[evaluator.classes[c] for c in relation],
            relation_gain_AP=rel['gain'] / 100,
            relation_interval=[v / 100 for v in rel['interval']])
    rows.append(row)
    return rows, diffs


def mean_over_sites(rows: Sequence[Dict],
                    diffs: Dict[Tuple[str, str, str], np.ndarray],
                    level: float = INTERVAL_LEVEL) -> List[Dict]:
    """Per (method, prior), the mean over sites of the AP gain (the
    recipe-selection G of the split-half rows) with its interval: each
    resample's mean over sites of their (independent) resampled gains.

    Args:
        rows (Sequence[dict]): the site rows.
        diffs (dict): (site, method, prior) -> resampled gains (points).
        level (float): the coverage.

    Returns:
        list[dict]: ``method``, ``prior``, ``sites``, ``gain_AP``
        (fraction) and ``interval`` (fractions).
    """
    out: Dict[Tuple[str, str], Dict] = {}
    for r in rows:
        if 'gain_AP' not in r:
            continue
        key = (r['method'], r['prior'])
        entry = out.setdefault(key, dict(gains=[], draws=[]))
        entry['gains'].append(r['gain_AP'])
        entry['draws'].append(diffs[(r['site'], r['method'], r['prior'])])
        entry.setdefault('sites', []).append(r['site'])
    means = []
    for (method, prior), e in out.items():
        low, high = percentile_interval(np.mean(e['draws'], axis=0), level)
        means.append(
            dict(
                method=method,
                prior=prior,
                sites=e['sites'],
                gain_AP=float(np.mean(e['gains'])),
                interval=[low / 100, high / 100]))
    return means


def evaluate_site_halves(methods: Sequence[Method],
                         evaluator: CocoEvaluator,
                         train_prior: np.ndarray,
                         parts: Dict[str, np.ndarray],
                         site_priors: Dict[str, np.ndarray],
                         train_shares: Optional[np.ndarray] = None,
                         in_sample: bool = True,
                         resamples: int = RESAMPLES,
                         seed: int = 0,
                         level: float = INTERVAL_LEVEL) -> Dict:
    """The site table: per site and method, E_t, the in-sample E_site and
    the split-half E_site (:func:`site_rows`), each gain with its
    interval, and the mean over sites.

    Args:
        methods (Sequence[Method]): the detectors.
        evaluator (CocoEvaluator): the annotations.
        train_prior (np.ndarray): E_t.
        parts (dict): each site's image indices (table order).
        site_priors (dict): each site's statistics on all its images (the
            in-sample prior and the epsilon column).
        train_shares (np.ndarray, optional): (K,) training's class
            shares: the relation-only gain of each split-half row
            (:func:`relation_classes`); ``None``: none.
        in_sample (bool): also the in-sample rows.
        resamples, seed, level: the bootstrap's.

    Returns:
        dict: ``rows`` (``site``, ``num_images``, ``method``, ``epsilon``,
        ``prior``, the metrics, ``gain_<metric>`` and ``interval``) and
        ``means`` (:func:`mean_over_sites`).
    """
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    missing = [s for s in parts if s not in site_priors]
    if missing:
        raise ValueError(f'no prior for site {missing[0]!r}')
    labels = methods[0].cache.gt_label_lists() if methods else []
    k = len(train_prior)
    boot = dict(resamples=resamples, seed=seed, level=level)
    rows, diffs = [], {}
    for site, idx in parts.items():
        halves = site_halves(labels, idx, k)
        relation = None
        if train_shares is not None:
            _, shares = label_support([labels[i] for i in idx], k)
            relation = relation_classes(shares, train_shares)
        eps = prior_mae(site_priors[site], train_prior)
        for m in methods:
            common = dict(
                site=site, num_images=len(idx), method=m.name, epsilon=eps)
            if not m.takes_prior:
                evaluate = cache_evaluator(evaluator)
                rows.append(
                    dict(
                        common,
                        prior='-',
                        **evaluate(m.cache, m.rescorer.predict(None, idx),
                                   idx)))
                continue
            got, draws = site_rows(m, evaluator, train_prior,
                                   site_priors[site], halves, relation,
                                   in_sample, **boot)
            rows += [dict(common, **r) for r in got]
            diffs.update({(site, m.name, p): d for p, d in draws.items()})
    return dict(rows=rows, means=mean_over_sites(rows, diffs, level))
