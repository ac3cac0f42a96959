# Copyright (c) mmcalidet contributors. All rights reserved.
from ..head_kinds.decoder import cached_head_losses
from .cached_calibration import (CachedCalibration, CachedCalibrationMixin,
                                 CachedCaliDABDETR, CachedCaliDeformableDETR,
                                 CachedCaliDINO, CachedCaliFasterRCNN,
                                 CachedCaliFCOS, CachedCaliRTMDet,
                                 cached_calibration_type)
from .cali_dab_detr import CaliDABDETR
from .cali_deformable_detr import CaliDeformableDETR
from .cali_dino import CaliDINO
from .cali_faster_rcnn import CaliFasterRCNN
from .cali_fcos import CaliFCOS
from .cali_rtmdet import CaliRTMDet
from .calibratable import CalibratableDetectorMixin, defer_class_matching
from .calibratable_detr import CalibratableDETRMixin
from .calibratable_single_stage import CalibratableSingleStageMixin
from .calibratable_two_stage import CalibratableTwoStageMixin
from .calibrated_head_calls import CalibratedHeadCallsMixin
from .prior_state import PriorState

__all__ = [
    'CalibratableDetectorMixin', 'CalibratableDETRMixin', 'CaliDINO',
    'CaliDeformableDETR', 'defer_class_matching', 'CachedCalibration',
    'CachedCalibrationMixin', 'cached_calibration_type', 'cached_head_losses',
    'PriorState', 'CaliDABDETR', 'CaliRTMDet', 'CaliFCOS',
    'CalibratableSingleStageMixin', 'CalibratedHeadCallsMixin',
    'CaliFasterRCNN', 'CalibratableTwoStageMixin', 'CachedCaliDINO',
    'CachedCaliDeformableDETR', 'CachedCaliDABDETR', 'CachedCaliRTMDet',
    'CachedCaliFCOS', 'CachedCaliFasterRCNN'
]
