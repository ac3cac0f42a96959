# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibratable DETR: V' reaches the decoder's classification
branches through the head inputs of ``forward_transformer``."""
from typing import Dict, Tuple

from mmdet.structures import OptSampleList
from torch import Tensor

from .calibratable import CalibratableDetectorMixin


class CalibratableDETRMixin(CalibratableDetectorMixin):
    """A DETR-family detector (mmdet's ``DetectionTransformer``) whose
    decoder layers classify with ``W + rho V'``: put it before the detector
    class, ``class CaliX(CalibratableDETRMixin, X)``, where
    ``X.forward_transformer`` returns ``hidden_states`` (L, B, Q, d) and the
    ``bbox_head`` is a ``CalibratedClsMixin`` head. ``loss``, ``predict``
    and ``_forward`` are the detector's own: they hand the head inputs,
    V' among them, to the head.
    """

    def forward_transformer(self,
                            img_feats: Tuple[Tensor],
                            batch_data_samples: OptSampleList = None) -> Dict:
        """The detector's transformer, then the calibration inputs of the
        head (:meth:`calibration_inputs`): ``cali_vectors`` and, in
        training, ``priors``."""
        head_inputs_dict = super().forward_transformer(img_feats,
                                                       batch_data_samples)
        batch_size = head_inputs_dict['hidden_states'].shape[1]
        head_inputs_dict.update(
            self.calibration_inputs(batch_data_samples, batch_size))
        return head_inputs_dict
