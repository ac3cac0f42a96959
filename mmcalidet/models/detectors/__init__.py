# Copyright (c) mmcalidet contributors. All rights reserved.
from .cali_dino import CaliDINO
from .calibratable import CalibratableDetectorMixin

__all__ = ['CalibratableDetectorMixin', 'CaliDINO']
