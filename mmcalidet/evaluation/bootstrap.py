# Copyright (c) mmcalidet contributors. All rights reserved.
"""Bootstrap statistics of AP differences: the paired bootstrap over
images of two methods' per-image matches (:func:`paired_bootstrap`), and
the mean of repeated gains with its percentile interval
(:func:`mean_interval`).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..utils.validation import check_finite_array, check_float, check_int
from .image_matches import ImageMatches


def paired_bootstrap(first: ImageMatches,
                     second: ImageMatches,
                     resamples: int = 1000,
                     seed: int = 0,
                     level: float = 0.95,
                     strata: Optional[Sequence[Sequence[int]]] = None,
                     keep_diffs: bool = False) -> Dict:
    """AP(first) - AP(second) on the same images, with a paired bootstrap
    interval: images are resampled with replacement, both methods scored on
    each resample.

    With ``strata`` (disjoint sets of image positions, e.g. a site's two
    halves, each scored under the other half's statistics), each stratum is
    its own AP: the difference is the mean over strata of each stratum's
    AP difference, and each resample draws every stratum's images within
    that stratum (never pooling two strata into one AP).

    Args:
        first (ImageMatches): one method's matches.
        second (ImageMatches): the other's, on the same images.
        resamples (int): bootstrap resamples.
        seed (int): their random seed.
        level (float): the interval's coverage.
        strata (Sequence[Sequence[int]], optional): positions (into
            ``img_ids``) of each stratum; default one stratum of all.
        keep_diffs (bool): also return each resample's difference.

    Returns:
        dict: ``diff`` (on all images, AP points), ``low``, ``high`` (the
        percentile interval, AP points), ``resamples`` (those with a
        defined difference) and, with ``keep_diffs``, ``diffs`` (AP
        points, one per resample, ``nan`` where undefined).
    """
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    check_int('resamples', resamples, 0)
    if first.img_ids != second.img_ids:
        raise ValueError('a paired bootstrap needs the same images')
    n = len(first.img_ids)
    rng = np.random.default_rng(seed)
    if strata is None:
        # the draws one by one (the stream of the seed), scored all at once
        draws = [rng.integers(0, n, size=n) for _ in range(int(resamples))]
        draws = np.stack(draws) if draws else np.zeros((0, n), np.int64)
        a, b = first.ap_draws(draws), second.ap_draws(draws)
        diffs = 100 * (a - b)
        diff = 100 * (first.ap() - second.ap())
    else:
        strata = _check_strata(strata, n)
        per, point = [], []
        for s in strata:
            draws = s[rng.integers(0, len(s), size=(int(resamples), len(s)))]
            per.append(first.ap_draws(draws) - second.ap_draws(draws))
            point.append(first.ap(s) - second.ap(s))
        diffs = 100 * np.mean(per, axis=0) if resamples else np.zeros(0)
        diff = 100 * float(np.mean(point))
    finite = diffs[np.isfinite(diffs)]
    tail = 100 * (1 - level) / 2
    low, high = (
        np.percentile(finite, [tail, 100 - tail]) if len(finite) else
        (float('nan'), float('nan')))
    out = dict(
        diff=float(diff),
        low=float(low),
        high=float(high),
        resamples=len(finite))
    if keep_diffs:
        out['diffs'] = diffs
    return out


def _check_strata(strata: Sequence[Sequence[int]], n: int) -> List[np.ndarray]:
    """The strata as position arrays: non-empty, disjoint, below ``n``."""
    out = [np.asarray(s, dtype=np.int64).reshape(-1) for s in strata]
    if not out or any(not len(s) for s in out):
        raise ValueError('every stratum needs an image')
    every = np.concatenate(out)
    if every.min() < 0 or every.max() >= n:
        raise IndexError(f'stratum positions must lie in [0, {n})')
    if len(np.unique(every)) != len(every):
        raise ValueError('strata must be disjoint')
    return out


def percentile_interval(diffs: Sequence[float],
                        level: float = 0.9) -> Tuple[float, float]:
    """The percentile interval of resampled differences (``nan`` ones left
    out), e.g. of the mean over sites of their aligned
    :func:`paired_bootstrap` ``diffs`` (independent draws per site).

    Args:
        diffs (Sequence[float]): one difference per resample.
        level (float): the coverage.

    Returns:
        tuple[float, float]: ``(low, high)`` (``nan`` without a finite
        difference).
    """
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    diffs = np.asarray(diffs, dtype=np.float64)
    finite = diffs[np.isfinite(diffs)]
    if not len(finite):
        return float('nan'), float('nan')
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(values: Sequence[float],
                  resamples: int = 10000,
                  seed: int = 0,
                  level: float = 0.95) -> Dict[str, float]:
    """The mean of paired gains and its bootstrap percentile interval.

    Args:
        values (Sequence[float]): one gain per repeat.
        resamples (int): bootstrap resamples.
        seed (int): their seed.
        level (float): the coverage.

    Returns:
        dict: ``mean``, ``low``, ``high``.
    """
    check_finite_array(values, 'values')
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    check_int('resamples', resamples, 1)
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values),
                                size=(resamples, len(values)))].mean(1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return dict(mean=float(values.mean()), low=float(low), high=float(high))
