# Copyright (c) mmcalidet contributors. All rights reserved.
"""The dense sweep of a site's prior from E_t toward its own statistics
and past them, ``E_t + alpha (E_site - E_t)``: does the detector read the
direction of the site's shift, not only its presence pattern?
"""
from typing import Dict, List, Sequence

import numpy as np

from ..priors.shrinkage import check_alphas, shrink
from .coco import CocoEvaluator
from .scoring import Rescorer

#: the dense sweep of a site's prior from E_t (0) past its own statistics
#: (1): does the detector read the direction of the shift, not only its
#: presence pattern?
SWEEP_ALPHAS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)


def shrinkage_sweep(rescorer: Rescorer,
                    evaluator: CocoEvaluator,
                    train_prior: np.ndarray,
                    site_prior: np.ndarray,
                    indices: Sequence[int],
                    alphas: Sequence[float] = SWEEP_ALPHAS) -> List[Dict]:
    """AP of a site's images under ``E_t + alpha (E_site - E_t)`` for each
    alpha (:func:`shrink`). A detector that reads the relations gains
    along positive alpha on a site whose own statistics help, peaking near
    1, and loses along negative alpha (the shift reversed).

    Args:
        rescorer (Rescorer): the detector on the cached images.
        evaluator (CocoEvaluator): their annotations.
        train_prior (np.ndarray): E_t.
        site_prior (np.ndarray): E_site.
        indices (Sequence[int]): the site's cached images.
        alphas (Sequence[float]): the points of the sweep.

    Returns:
        list[dict]: per alpha ``alpha``, ``AP`` (points) and ``gain``
        over alpha 0 (E_t) in points.
    """
    check_alphas(alphas, positive=False)
    indices = np.asarray(indices, dtype=np.int64)
    img_ids = rescorer.cache.img_ids()
    ids = [img_ids[i] for i in indices]

    def ap(prior):
        return 100 * evaluator.evaluate_ap(ids, rescorer.predict(
            prior, indices))

    base = ap(np.asarray(train_prior, dtype=np.float64))
    rows = []
    for alpha in alphas:
        value = base if alpha == 0 else ap(
            shrink(train_prior, site_prior, alpha))
        rows.append(dict(alpha=float(alpha), AP=value, gain=value - base))
    return rows
