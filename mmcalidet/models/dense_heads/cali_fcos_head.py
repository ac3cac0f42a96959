# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFCOSHead: FCOS's head with calibrated classification and LoMa (the
worked example of ``docs/user_guides/new_baseline.md``)."""
from typing import Dict, List

from mmdet.models.dense_heads import FCOSHead
from mmdet.registry import MODELS
from mmdet.utils import InstanceList, OptInstanceList
from torch import Tensor

from ..head_kinds.fcos import assigned_labels, flat_cls_scores
from .calibrated_dense_cls import CalibratedDenseClsMixin


@MODELS.register_module()
class CaliFCOSHead(CalibratedDenseClsMixin, FCOSHead):
    """FCOS head whose classification conv (``conv_cls``, 3 x 3, shared by
    the levels) is ``W + rho * V'`` at its kernel's centre, with one
    CaliFormer, and LoMa on the assigned class of the positive locations
    (those inside a ground-truth box's centre region and regression
    range). The centerness and box branches stay FCOS's.

    Args:
        califormer (dict): config of the :class:`CaliFormer`; d is the
            head's ``feat_channels``.
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        *args, **kwargs: the arguments of mmdet's ``FCOSHead``.
    """

    def loss_by_feat(
        self,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        centernesses: List[Tensor],
        batch_gt_instances: InstanceList,
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: OptInstanceList = None
    ) -> Dict[str, Tensor]:
        """FCOS's losses; inside :meth:`loss` with LoMa, the labels of all
        locations are recorded too (:meth:`record_targets`; FCOS assigns
        by geometry alone: the labels its loss used).

        Args:
            cls_scores, bbox_preds, centernesses (list[Tensor]): the
                levels' outputs.
            batch_gt_instances (list[InstanceData]): the ground truth.
            batch_img_metas (list[dict]): the images' meta.
            batch_gt_instances_ignore (list[InstanceData], optional):
                ignored boxes.

        Returns:
            dict[str, Tensor]: FCOS's losses.
        """
        losses = super().loss_by_feat(cls_scores, bbox_preds, centernesses,
                                      batch_gt_instances, batch_img_metas,
                                      batch_gt_instances_ignore)
        if self.recording_targets:
            self.record_targets(
                flat_cls_scores(cls_scores),
                assigned_labels(self, cls_scores, batch_gt_instances))
        return losses
