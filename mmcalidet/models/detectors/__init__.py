# Copyright (c) mmcalidet contributors. All rights reserved.
from .cali_deformable_detr import CaliDeformableDETR
from .cali_dino import CaliDINO
from .calibratable import CalibratableDetectorMixin, defer_class_matching

__all__ = [
    'CalibratableDetectorMixin', 'CaliDINO', 'CaliDeformableDETR',
    'defer_class_matching'
]
