# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable one-stage detector: the prior reaches a dense head."""
from .calibrated_head_calls import CalibratedHeadCallsMixin


class CalibratableSingleStageMixin(CalibratedHeadCallsMixin):
    """A one-stage detector (mmdet's ``SingleStageDetector``) whose dense
    head's classification follows an injected prior.

    Put it before the detector class:
    ``class CaliX(CalibratableSingleStageMixin, X)``; the ``bbox_head``
    must be a calibrated dense head (``CalibratedDenseClsMixin``). The
    prior plumbing is :class:`CalibratableDetectorMixin`'s; ``loss``,
    ``predict`` and ``_forward`` run the detector's own with V' (and the
    training priors) handed to the head for that call
    (:class:`CalibratedHeadCallsMixin`).
    """
