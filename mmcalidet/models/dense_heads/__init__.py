# Copyright (c) mmcalidet contributors. All rights reserved.
from .cali_dab_detr_head import CaliDABDETRHead
from .cali_deformable_detr_head import CaliDeformableDETRHead
from .cali_dino_head import CaliDINOHead
from .calibrated_cls import CalibratedClsMixin

__all__ = [
    'CalibratedClsMixin', 'CaliDINOHead', 'CaliDeformableDETRHead',
    'CaliDABDETRHead'
]
