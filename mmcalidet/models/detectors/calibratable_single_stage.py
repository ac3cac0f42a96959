# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable one-stage detector: the prior reaches a dense head."""
from typing import Tuple

from mmdet.structures import SampleList
from mmdet.utils import InstanceList
from torch import Tensor

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

    def head_predict(self, feats: Tuple[Tensor, ...],
                     batch_data_samples: SampleList,
                     rescale: bool) -> InstanceList:
        """``SingleStageDetector.predict``'s head call: the dense head's
        ``predict`` on the features (arguments: see
        :meth:`CalibratedHeadCallsMixin.head_predict`)."""
        return self.bbox_head.predict(
            feats, batch_data_samples, rescale=rescale)
