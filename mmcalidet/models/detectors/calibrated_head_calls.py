# Copyright (c) mmcalidet contributors. All rights reserved.
"""Hand V' to a calibrated head around the detector's own calls."""
import contextlib
from typing import Iterator, Optional, Tuple, Union

from mmdet.structures import OptSampleList, SampleList
from mmdet.utils import InstanceList
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

    :meth:`predict_from_feats` runs the detector's prediction heads
    (:meth:`head_predict`, the one- or two-stage mixin's) on features
    already extracted: what re-scoring cached features under many priors
    needs (:class:`~mmcalidet.evaluation.HeadRescorer`).
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

    def head_predict(self, feats: Tuple[Tensor, ...],
                     batch_data_samples: SampleList,
                     rescale: bool) -> InstanceList:
        """The head calls of the detector's ``predict`` after
        ``extract_feat`` (the one- or two-stage mixin's).

        Args:
            feats (tuple[Tensor]): the levels' features.
            batch_data_samples (list[DetDataSample]): the data samples.
            rescale (bool): boxes in original image coordinates.

        Returns:
            list[InstanceData]: the detections per image.
        """
        raise NotImplementedError(
            f'{type(self).__name__} names no prediction heads: use '
            'CalibratableSingleStageMixin or CalibratableTwoStageMixin')

    def predict_from_feats(self,
                           feats: Tuple[Tensor, ...],
                           batch_data_samples: SampleList,
                           rescale: bool = True,
                           cali_vectors: Optional[Tensor] = None
                           ) -> InstanceList:
        """The predictions ``predict`` gives from the features
        ``extract_feat`` gave, without the backbone and the neck.

        Args:
            feats (tuple[Tensor]): the levels' features, (B, C, H, W) each.
            batch_data_samples (list[DetDataSample]): their data samples.
            rescale (bool): boxes in original image coordinates.
            cali_vectors (Tensor, optional): V' to classify with, (K, d)
                shared or (B, K, d) per image; default the deployment
                prior's, or each data sample's ``prior`` (as ``predict``).

        Returns:
            list[InstanceData]: per image ``bboxes``, ``scores``,
            ``labels``.
        """
        if cali_vectors is None:
            context = self.head_calibration(feats[0], batch_data_samples)
        else:
            k, d = self.num_classes, \
                self.calibrated_head.calibrated_feature_dims()
            if tuple(cali_vectors.shape[-2:]) != (k, d) or \
                    cali_vectors.dim() not in (2, 3) or (
                        cali_vectors.dim() == 3
                        and len(cali_vectors) != len(batch_data_samples)):
                raise ValueError(
                    f'cali_vectors must be ({k}, {d}) or (B, {k}, {d}) for '
                    f'B = {len(batch_data_samples)} images, got '
                    f'{tuple(cali_vectors.shape)}')
            context = self.calibrated_head.calibrated(cali_vectors)
        with context:
            return self.head_predict(feats, batch_data_samples, rescale)
