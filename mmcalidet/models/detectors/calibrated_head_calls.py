# Copyright (c) mmcalidet contributors. All rights reserved.
"""Hand V' to a calibrated head around the detector's own calls."""
import contextlib
from typing import Iterator, Optional, Union

from mmdet.structures import OptSampleList, SampleList
from torch import Tensor

from .calibratable import CalibratableDetectorMixin


class CalibratedHeadCallsMixin(CalibratableDetectorMixin):
    """A detector whose ``loss``, ``predict`` and ``_forward`` are its
    own, run with V' (and, in training, the per-image priors) handed to
    its ``calibrated_head`` for the call: one-stage
    (:class:`CalibratableSingleStageMixin`) and two-stage
    (:class:`CalibratableTwoStageMixin`) detectors, whose heads take V'
    through a ``calibrated(cali_vectors, priors)`` context rather than as
    an argument of a DETR head's ``forward``.
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
