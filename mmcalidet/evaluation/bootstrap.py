# Copyright (c) mmcalidet contributors. All rights reserved.
"""Bootstrap statistics of AP differences: the paired bootstrap over
images of two methods' per-image matches (:func:`paired_bootstrap`), and
the mean of repeated gains with its percentile interval
(:func:`mean_interval`).
"""
from typing import Dict, Sequence

import numpy as np

from ..utils.validation import check_finite_array, check_float, check_int
from .image_matches import ImageMatches


def paired_bootstrap(first: ImageMatches,
                     second: ImageMatches,
                     resamples: int = 1000,
                     seed: int = 0,
                     level: float = 0.95) -> Dict[str, float]:
    """AP(first) - AP(second) on the same images, with a paired bootstrap
    interval: images are resampled with replacement, both methods scored on
    each resample.

    Args:
        first (ImageMatches): one method's matches.
        second (ImageMatches): the other's, on the same images.
        resamples (int): bootstrap resamples.
        seed (int): their random seed.
        level (float): the interval's coverage.

    Returns:
        dict: ``diff`` (on all images, AP points), ``low``, ``high`` (the
        percentile interval, AP points), ``resamples``.
    """
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    check_int('resamples', resamples, 0)
    if first.img_ids != second.img_ids:
        raise ValueError('a paired bootstrap needs the same images')
    n = len(first.img_ids)
    rng = np.random.default_rng(seed)
    # the draws one by one (the stream of the seed), scored all at once
    draws = [rng.integers(0, n, size=n) for _ in range(int(resamples))]
    draws = np.stack(draws) if draws else np.zeros((0, n), np.int64)
    a, b = first.ap_draws(draws), second.ap_draws(draws)
    both = np.isfinite(a) & np.isfinite(b)
    diffs = list(100 * (a[both] - b[both]))
    tail = 100 * (1 - level) / 2
    low, high = (
        np.percentile(diffs, [tail, 100 - tail]) if diffs else
        (float('nan'), float('nan')))
    return dict(
        diff=100 * (first.ap() - second.ap()),
        low=float(low),
        high=float(high),
        resamples=len(diffs))


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
