# Copyright (c) mmcalidet contributors. All rights reserved.
"""Online self-calibration measured as it is deployed: a site's images
arrive in batches, each batch is predicted under the calibrator's current
E_c and only then observed by it (:func:`stream_site`, now in
:mod:`mmcalidet.evaluation.online`; re-exported here)."""
from mmcalidet.evaluation.online import stream_site

__all__ = ['stream_site']
