# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable one-stage detector: the prior reaches a dense head."""
import contextlib
from typing import Iterator, Optional, Union

from mmdet.structures import OptSampleList, SampleList
from torch import Tensor

from .calibratable import CalibratableDetectorMixin


class CalibratableSingleStageMixin(CalibratableDetectorMixin):
    """A one-stage detector (mmdet's ``SingleStageDetector``) whose dense
    head's classification follows an injected prior.

    Put it before the detector class:
    ``class CaliX(CalibratableSingleStageMixin, X)``; the ``bbox_head``
    must be a calibrated dense head (``CalibratedDenseClsMixin``). The
    prior plumbing is :class:`CalibratableDetectorMixin`'s; ``loss``,
    ``predict`` and ``_forward`` run the detector's own with V' (and the
    training priors) handed to the head for that call.
    """

    @contextlib.contextmanager
    def head_calibration(self, batch_inputs: Union[Tensor, dict],
                         batch_data_samples: OptSampleList) -> Iterator[None]:
        """Calibrate the head with the batch's priors inside the block."""
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
        """The head's raw outputs under the deployment prior (or the data
        samples' priors)."""
        with self.head_calibration(batch_inputs, batch_data_samples):
            return super()._forward(batch_inputs, batch_data_samples)
