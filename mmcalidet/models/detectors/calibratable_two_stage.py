# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable two-stage detector: the prior reaches the RoI box
head."""
import contextlib
from typing import Iterator, Optional, Union

from mmdet.structures import OptSampleList, SampleList
from torch import Tensor, nn

from .calibratable import CalibratableDetectorMixin


class CalibratableTwoStageMixin(CalibratableDetectorMixin):
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
    handed to the box head for that call.
    """

    @property
    def calibrated_head(self) -> nn.Module:
        """The head that owns the CaliFormer: ``roi_head.bbox_head``."""
        return self.roi_head.bbox_head

    @contextlib.contextmanager
    def head_calibration(self, batch_inputs: Union[Tensor, dict],
                         batch_data_samples: OptSampleList) -> Iterator[None]:
        """Calibrate the box head with the batch's priors inside the
        block."""
        if batch_data_samples:
            batch_size = len(batch_data_samples)
        else:
            batch_size = getattr(batch_inputs, 'shape', (1, ))[0]
        inputs = self.calibration_inputs(batch_data_samples, batch_size)
        with self.calibrated_head.calibrated(**inputs):
            yield

    def loss(self, batch_inputs: Tensor,
             batch_data_samples: SampleList) -> dict:
        """The detector's losses, with the per-image training priors."""
        with self.head_calibration(batch_inputs, batch_data_samples):
            return super().loss(batch_inputs, batch_data_samples)

    def predict(self,
                batch_inputs: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        """The detector's predictions under the deployment prior, or each
        data sample's ``prior``."""
        with self.head_calibration(batch_inputs, batch_data_samples):
            return super().predict(batch_inputs, batch_data_samples, rescale)

    def _forward(self,
                 batch_inputs: Tensor,
                 batch_data_samples: Optional[SampleList] = None) -> tuple:
        """The RPN's and the box head's raw outputs under the deployment
        prior (or the data samples' priors)."""
        with self.head_calibration(batch_inputs, batch_data_samples):
            return super()._forward(batch_inputs, batch_data_samples)
