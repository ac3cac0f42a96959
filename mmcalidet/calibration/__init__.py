# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a user runs at a site (see docs/user_guides/calibrate.md and
self_calibrate.md): a prior fitted from a few labelled site images, or the
detector's own predictions turned into one, with no parameter update.

* ``site_prior``, ``cross_fitting``: the site's statistics shrunk toward
  E_t by as much as cross-validation on the labelled images supports --
  :func:`fit_site_prior`;
* ``site_draws``: such a fit measured as a user deploys it, over draws of
  the labelled images -- :func:`deployment_gains`;
* ``update``: the update of Algo. 1 and its trust radius;
* ``self_calibration``: Algo. 1 on a set of images -- :func:`self_calibrate`;
* ``online``: the same from a stream of predictions --
  :class:`OnlineSelfCalibrator`.

It scores priors with the evaluation's re-scorers and metrics
(:mod:`mmcalidet.evaluation`); of the evaluation, only the protocol's
tables (:mod:`mmcalidet.evaluation.protocol`) import it.
"""
from .online import OnlineSelfCalibrator, stream_site
from .self_calibration import (SelfCalibrationResult, mean_history,
                               self_calibrate, self_calibrate_partitions)
from .site_draws import deployment_gains
from .site_prior import (ACCEPT, ALPHAS, DEFAULT_ACCEPT, SitePriorFit,
                         fit_site_prior)
from .update import (DEFAULT_ETA, DEFAULT_SCORE_THR, DEFAULT_TRUST_RADIUS,
                     calibration_step, prediction_statistics, update_target,
                     within_trust_region)

__all__ = [
    'fit_site_prior', 'SitePriorFit', 'ALPHAS', 'ACCEPT', 'DEFAULT_ACCEPT',
    'deployment_gains', 'self_calibrate', 'self_calibrate_partitions',
    'SelfCalibrationResult', 'mean_history', 'OnlineSelfCalibrator',
    'stream_site', 'DEFAULT_ETA', 'DEFAULT_SCORE_THR', 'DEFAULT_TRUST_RADIUS',
    'prediction_statistics', 'update_target', 'calibration_step',
    'within_trust_region'
]
