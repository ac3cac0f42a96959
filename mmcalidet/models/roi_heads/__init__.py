# Copyright (c) mmcalidet contributors. All rights reserved.
from .cali_convfc_bbox_head import CaliShared2FCBBoxHead
from .cali_standard_roi_head import CaliStandardRoIHead
from .calibrated_bbox_cls import CalibratedBBoxClsMixin, pad_by_image

__all__ = [
    'CalibratedBBoxClsMixin', 'CaliShared2FCBBoxHead', 'CaliStandardRoIHead',
    'pad_by_image'
]
