# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliShared2FCBBoxHead: Faster R-CNN's box head with calibrated
classification and LoMa."""
from mmdet.models.roi_heads.bbox_heads import Shared2FCBBoxHead
from mmdet.registry import MODELS

from .calibrated_bbox_cls import CalibratedBBoxClsMixin


@MODELS.register_module()
class CaliShared2FCBBoxHead(CalibratedBBoxClsMixin, Shared2FCBBoxHead):
    """Box head of two shared fcs whose classifier (``fc_cls``) is
    ``W + rho * V'`` on the K class logits (the background logit stays
    uncalibrated), and LoMa on the target class of the sampled positive
    RoIs.

    Args:
        califormer (dict): config of the :class:`CaliFormer`; d is the fcs'
            output width (``fc_out_channels``).
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        *args, **kwargs: the arguments of mmdet's ``Shared2FCBBoxHead``.
    """
