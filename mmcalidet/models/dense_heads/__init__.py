# Copyright (c) mmcalidet contributors. All rights reserved.
from .cali_dab_detr_head import CaliDABDETRHead
from .cali_deformable_detr_head import CaliDeformableDETRHead
from .cali_dino_head import CaliDINOHead
from .cali_fcos_head import CaliFCOSHead
from .cali_rtmdet_head import CaliRTMDetHead
from .calibrated_cls import CalibratedClsMixin
from .calibrated_dense_cls import CalibratedDenseClsMixin
from .califormer_head import CaliFormerHeadMixin

__all__ = [
    'CaliFormerHeadMixin', 'CalibratedClsMixin', 'CalibratedDenseClsMixin',
    'CaliDINOHead', 'CaliDeformableDETRHead', 'CaliDABDETRHead',
    'CaliRTMDetHead', 'CaliFCOSHead'
]
