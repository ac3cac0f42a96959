# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable two-stage detector: the prior reaches the RoI box
head."""
from typing import Tuple

from mmdet.structures import SampleList
from mmdet.utils import InstanceList
from torch import Tensor, nn

from .calibrated_head_calls import CalibratedHeadCallsMixin


class CalibratableTwoStageMixin(CalibratedHeadCallsMixin):
    """A two-stage detector (mmdet's ``TwoStageDetector``) whose RoI box
    head's classification follows an injected prior.

    Put it before the detector class:
    ``class CaliX(CalibratableTwoStageMixin, X)``; the ``roi_head`` must
    hand its box head the RoIs' images (``CaliStandardRoIHead``) and the
    box head must be calibrated (``CalibratedBBoxClsMixin``). The RPN is
    the detector's own: the prior only reaches the box head's
    classification. The prior plumbing is
    :class:`CalibratableDetectorMixin`'s; ``loss``, ``predict`` and
    ``_forward`` run the detector's own with V' (and the training priors)
    handed to the box head for that call
    (:class:`CalibratedHeadCallsMixin`).
    """

    @property
    def calibrated_head(self) -> nn.Module:
        """The head that owns the CaliFormer: ``roi_head.bbox_head``."""
        return self.roi_head.bbox_head

    def head_predict(self, feats: Tuple[Tensor, ...],
                     batch_data_samples: SampleList,
                     rescale: bool) -> InstanceList:
        """``TwoStageDetector.predict``'s head calls: the data samples'
        ``proposals``, else the RPN's, then the RoI head's ``predict``
        (arguments: see :meth:`CalibratedHeadCallsMixin.head_predict`)."""
        if batch_data_samples[0].get('proposals', None) is None:
            proposals = self.rpn_head.predict(
                feats, batch_data_samples, rescale=False)
        else:
            proposals = [ds.proposals for ds in batch_data_samples]
        return self.roi_head.predict(
            feats, proposals, batch_data_samples, rescale=rescale)
