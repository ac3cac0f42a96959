# Copyright (c) mmcalidet contributors. All rights reserved.
"""The dense sweep of a site's prior from E_t toward its own statistics
and past them, ``E_t + alpha (E_site - E_t)``: does the detector read the
direction of the site's shift, not only its presence pattern?
"""
from typing import Callable, Dict, List, Sequence

import numpy as np

from ..priors.shrinkage import check_alphas, shrink
from ..utils.validation import check_float
from .coco import CocoEvaluator
from .scoring import Rescorer
from .split_half import (IN_SAMPLE, INTERVAL_LEVEL, RESAMPLES, SPLIT_HALF,
                         SiteHalves, gain_of, register_half_supports,
                         scored_matches)

#: the dense sweep of a site's prior from E_t (0) past its own statistics
#: (1): does the detector read the direction of the shift, not only its
#: presence pattern?
SWEEP_ALPHAS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)


def _sweep_points(rescorer, evaluator: CocoEvaluator,
                  parts_of: Callable[[float], list], alphas: Sequence[float],
                  boot: Dict, prior: str) -> List[Dict]:
    """The sweep's rows: per alpha the AP (points; the mean of the parts'
    APs) and its gain over alpha 0 with its interval, each part of
    ``parts_of(alpha)`` (``(images, prior)``) its own stratum."""
    check_alphas(alphas, positive=False)
    img_ids = rescorer.cache.img_ids()

    def scored(alpha):
        parts = parts_of(alpha)
        matches, strata, preds = scored_matches(rescorer, evaluator, parts)
        ap = np.mean([
            evaluator.evaluate_ap([img_ids[i] for i in idx], p)
            for (idx, _), p in zip(parts, preds)
        ])
        return matches, (strata if len(strata) > 1 else None), 100 * ap

    base, strata, base_ap = scored(0.0)
    rows = []
    for alpha in alphas:
        if alpha == 0:
            rows.append(
                dict(
                    alpha=0.0,
                    prior=prior,
                    AP=base_ap,
                    gain=0.0,
                    interval=[0.0, 0.0]))
            continue
        own, _, value = scored(alpha)
        res = gain_of(own, base, strata, **boot)
        rows.append(
            dict(
                alpha=float(alpha),
                prior=prior,
                AP=value,
                gain=value - base_ap,
                interval=res['interval']))
    return rows


def shrinkage_sweep(rescorer: Rescorer,
                    evaluator: CocoEvaluator,
                    train_prior: np.ndarray,
                    site_prior: np.ndarray,
                    indices: Sequence[int],
                    alphas: Sequence[float] = SWEEP_ALPHAS,
                    resamples: int = RESAMPLES,
                    seed: int = 0,
                    level: float = INTERVAL_LEVEL) -> List[Dict]:
    """AP of a site's images under ``E_t + alpha (E_site - E_t)`` for each
    alpha (:func:`shrink`), E_site measured on the same images (in-sample).
    A detector that reads the relations gains along positive alpha on a
    site whose own statistics help, peaking near 1, and loses along
    negative alpha (the shift reversed).

    Args:
        rescorer (Rescorer): the detector on the cached images.
        evaluator (CocoEvaluator): their annotations.
        train_prior (np.ndarray): E_t.
        site_prior (np.ndarray): E_site.
        indices (Sequence[int]): the site's cached images.
        alphas (Sequence[float]): the points of the sweep.
        resamples, seed, level: the gains' paired bootstrap.

    Returns:
        list[dict]: per alpha ``alpha``, ``prior`` (``E_site(in-sample)``),
        ``AP`` (points), ``gain`` over alpha 0 (E_t) in points and its
        ``interval``.
    """
    check_alphas(alphas, positive=False)
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    indices = np.asarray(indices, dtype=np.int64)
    train_prior = np.asarray(train_prior, dtype=np.float64)
    return _sweep_points(
        rescorer, evaluator,
        lambda a: [(indices, train_prior
                    if a == 0 else shrink(train_prior, site_prior, a))],
        alphas, dict(resamples=resamples, seed=seed, level=level), IN_SAMPLE)


def split_half_sweep(rescorer: Rescorer,
                     evaluator: CocoEvaluator,
                     train_prior: np.ndarray,
                     halves: SiteHalves,
                     alphas: Sequence[float] = SWEEP_ALPHAS,
                     resamples: int = RESAMPLES,
                     seed: int = 0,
                     level: float = INTERVAL_LEVEL) -> List[Dict]:
    """:func:`shrinkage_sweep` split-half: each half under ``E_t + alpha
    (E_other - E_t)`` of the other half's statistics (registered with the
    other half's support, its shares moved as the prior, when E_t has
    one), each half its own AP, the halves' gains averaged.

    Returns:
        list[dict]: per alpha, as :func:`shrinkage_sweep` with ``prior``
        ``E_site``.
    """
    check_alphas(alphas, positive=False)
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    train_prior = np.asarray(train_prior, dtype=np.float64)
    register_half_supports(rescorer, halves)
    train_support = rescorer.support_of(train_prior) if getattr(
        rescorer, 'reads_support', False) else None

    def parts_of(alpha):
        parts = []
        for h in (0, 1):
            idx, other = halves.scoring(h)
            prior = train_prior if alpha == 0 else shrink(
                train_prior, other, alpha)
            if train_support is not None and alpha != 0:
                n, share = halves.supports[1 - h]
                p_t = train_support[1]
                rescorer.register_support(
                    prior, n, np.clip(p_t + alpha * (share - p_t), 0, 1))
            parts.append((idx, prior))
        return parts

    return _sweep_points(rescorer, evaluator, parts_of, alphas,
                         dict(resamples=resamples, seed=seed, level=level),
                         SPLIT_HALF)
