# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior moved from E_t toward a site's statistics: the site's estimate
from labelled images (:func:`site_estimate`, with two forms of the columns
of the classes the images never show) and the shrinkage ``E_t + alpha
(E_site - E_t)`` (:func:`shrink`) that site-prior fitting, the shrinkage
sweep and the evaluation's supports share, and the check of its
strengths (:func:`check_alphas`).
"""
from typing import Sequence

import numpy as np

from ..utils.validation import check_float
from .statistics import batch_prior

#: the two estimates of a site's columns for classes its images never show
ABSENT = ('train', 'flat')


def site_estimate(label_lists: Sequence[Sequence[int]],
                  train_prior: np.ndarray,
                  absent: str = 'train') -> np.ndarray:
    """E_site of labelled images.

    Args:
        label_lists (Sequence): the images' class indices.
        train_prior (np.ndarray): E_t, K x K.
        absent (str): the columns of classes no image shows: ``'train'``
            (E_t's) or ``'flat'`` (0.5, as ``batch_prior`` has them).

    Returns:
        np.ndarray: K x K float64.
    """
    if absent not in ABSENT:
        raise ValueError(f'absent must be one of {ABSENT}, got {absent!r}')
    num_classes = len(train_prior)
    estimate = batch_prior(num_classes, label_lists)
    if absent == 'train':
        seen = np.zeros(num_classes, dtype=bool)
        for labels in label_lists:
            seen[np.asarray(labels, dtype=np.int64)] = True
        estimate[:, ~seen] = np.asarray(train_prior)[:, ~seen]
    return estimate


def shrink(train_prior: np.ndarray, estimate: np.ndarray,
           alpha: float) -> np.ndarray:
    """``E_t + alpha (E_site - E_t)``, clipped to [0, 1], 1 on the
    diagonal.

    Args:
        train_prior (np.ndarray): E_t.
        estimate (np.ndarray): E_site.
        alpha (float): how far to move toward E_site (1: E_site itself).

    Returns:
        np.ndarray: K x K float64.
    """
    check_float('alpha', alpha)
    train_prior = np.asarray(train_prior, dtype=np.float64)
    prior = np.clip(train_prior + alpha * (estimate - train_prior), 0.0, 1.0)
    np.fill_diagonal(prior, 1.0)
    return prior


def check_alphas(alphas: Sequence[float], positive: bool = True) -> None:
    """Refuse shrinkage candidates that are not finite numbers (> 0 with
    ``positive``: 0 is E_t, the fallback), naming ``alphas``."""
    try:
        values = [float(a) for a in alphas]
    except (TypeError, ValueError):
        values = []
    if not values or any(not np.isfinite(a) or (positive and a <= 0)
                         for a in values):
        bound = ' and > 0' if positive else ''
        raise ValueError(f'alphas must be finite{bound} numbers, got '
                         f'{alphas}')
