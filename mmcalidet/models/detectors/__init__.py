# Copyright (c) mmcalidet contributors. All rights reserved.
from .cached_calibration import (CachedCalibration, CachedCalibrationMixin,
                                 cached_calibration_type, cached_head_losses)
from .cali_dab_detr import CaliDABDETR
from .cali_deformable_detr import CaliDeformableDETR
from .cali_dino import CaliDINO
from .cali_faster_rcnn import CaliFasterRCNN
from .cali_rtmdet import CaliRTMDet
from .calibratable import CalibratableDetectorMixin
from .calibratable_single_stage import CalibratableSingleStageMixin
from .calibratable_two_stage import CalibratableTwoStageMixin
from .calibrated_head_calls import CalibratedHeadCallsMixin
from .prior_buffer import PriorBufferMixin
from .prior_classes import PriorClassesMixin, defer_class_matching

__all__ = [
    'CalibratableDetectorMixin', 'CaliDINO', 'CaliDeformableDETR',
    'defer_class_matching', 'CachedCalibration', 'CachedCalibrationMixin',
    'cached_calibration_type', 'cached_head_losses', 'PriorBufferMixin',
    'PriorClassesMixin', 'CaliDABDETR', 'CaliRTMDet',
    'CalibratableSingleStageMixin', 'CalibratedHeadCallsMixin',
    'CaliFasterRCNN', 'CalibratableTwoStageMixin'
]
