# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliRTMDetHead: RTMDet's head with calibrated classification and
LoMa."""
import torch
from mmdet.models.dense_heads import RTMDetSepBNHead
from mmdet.registry import MODELS
from torch import Tensor

from .calibrated_dense_cls import CalibratedDenseClsMixin


@MODELS.register_module()
class CaliRTMDetHead(CalibratedDenseClsMixin, RTMDetSepBNHead):
    """RTMDet head whose levels' 1 x 1 classification convs (``rtm_cls``)
    are ``W_l + rho * V'``, with one CaliFormer for all levels, and LoMa
    on the assigned class of the positive locations (those the
    ``DynamicSoftLabelAssigner`` gives a class).

    Args:
        califormer (dict): config of the :class:`CaliFormer`.
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        *args, **kwargs: the arguments of mmdet's ``RTMDetSepBNHead``.
    """

    cls_conv_name = 'rtm_cls'

    def get_targets(self, cls_scores: Tensor, bbox_preds: Tensor, *args,
                    **kwargs) -> tuple:
        """RTMDet's targets; the labels of all locations are recorded for
        LoMa (:meth:`record_targets`)."""
        targets = super().get_targets(cls_scores, bbox_preds, *args, **kwargs)
        if targets is not None:
            self.record_targets(cls_scores, torch.cat(targets[1], dim=1))
        return targets
