# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliStandardRoIHead: the RoI head of a calibratable two-stage
detector."""
from typing import Tuple

from mmdet.models.roi_heads import StandardRoIHead
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.utils import InstanceList
from torch import Tensor


@MODELS.register_module()
class CaliStandardRoIHead(StandardRoIHead):
    """mmdet's ``StandardRoIHead`` for a calibrated box head
    (``CalibratedBBoxClsMixin``): it tells the box head the image of every
    RoI (so that per-image V' reach each image's RoIs) and, in training,
    the data samples (each image's E_x for LoMa). Everything else is
    mmdet's.

    Args:
        *args, **kwargs: the arguments of mmdet's ``StandardRoIHead``.
    """

    def _bbox_forward(self, x: Tuple[Tensor], rois: Tensor) -> dict:
        """mmdet's box forward, the box head told the RoIs' images.

        Args:
            x (tuple[Tensor]): the levels' features.
            rois (Tensor): (N, 5) RoIs, the image index first.

        Returns:
            dict[str, Tensor]: ``cls_score``, ``bbox_pred``, ``bbox_feats``.
        """
        with self.bbox_head.roi_images(rois[:, 0]):
            return super()._bbox_forward(x, rois)

    def loss(self, x: Tuple[Tensor], rpn_results_list: InstanceList,
             batch_data_samples: SampleList) -> dict:
        """mmdet's losses, the box head told the data samples (for
        LoMa).

        Args:
            x (tuple[Tensor]): the levels' features.
            rpn_results_list (list[InstanceData]): the proposals.
            batch_data_samples (list[DetDataSample]): the data samples.

        Returns:
            dict[str, Tensor]: the losses.
        """
        with self.bbox_head.loma_samples(batch_data_samples):
            return super().loss(x, rpn_results_list, batch_data_samples)
