# Copyright (c) mmcalidet contributors. All rights reserved.
from .califormer import CaliFormer

__all__ = ['CaliFormer']
