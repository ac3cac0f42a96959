# Copyright (c) mmcalidet contributors. All rights reserved.
"""Online self-calibration measured as it is deployed: a site's images
arrive in batches, each batch is predicted under the calibrator's current
E_c and only then observed by it."""
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from mmcalidet.evaluation import OnlineSelfCalibrator


def stream_site(rescorer,
                evaluate: Callable,
                indices: Sequence[int],
                train_prior: np.ndarray,
                trust_radius: Optional[float],
                batch_size: int = 16,
                seed: int = 0,
                **options) -> Dict:
    """Stream a site's cached images through an
    :class:`~mmcalidet.evaluation.OnlineSelfCalibrator` started at E_t.

    Args:
        rescorer (Rescorer): the detector's re-scorer over the cache.
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        indices (Sequence[int]): the site's images (cache indices).
        train_prior (np.ndarray): E_t, the calibrator's start.
        trust_radius (float, optional): the calibrator's trust radius.
        batch_size (int): images per arriving batch.
        seed (int): seed of the (fixed) arrival order.
        **options: more ``OnlineSelfCalibrator`` options.

    Returns:
        dict: ``AP_start`` (E_t on the same images), ``AP_stream`` (the
        streamed predictions), ``gain``, ``updates`` and ``prior`` (E_c at
        the end).
    """
    order = np.random.default_rng(seed).permutation(np.asarray(indices))
    # a support-aware CaliFormer: E_c keeps E_t's registered support
    support = rescorer.support_of(train_prior)
    calibrator = OnlineSelfCalibrator(
        init_prior=train_prior,
        trust_radius=trust_radius,
        init_support=support,
        **options)
    predictions = []
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        out = rescorer.predict(calibrator.prior, batch)
        predictions.extend(out)
        if calibrator.update(out) and support is not None:
            rescorer.register_support(calibrator.prior, *support)
    cache = rescorer.cache
    # E_t on the site's images as the other tables score them (an image's
    # detections do not depend on its batch; the AP not on the order)
    indices = np.asarray(indices)
    start_ap = evaluate(cache, rescorer.predict(train_prior, indices),
                        indices)['AP']
    stream_ap = evaluate(cache, predictions, order)['AP']
    return dict(
        AP_start=start_ap,
        AP_stream=stream_ap,
        gain=stream_ap - start_ap,
        updates=calibrator.num_updates,
        prior=calibrator.prior)
