# Copyright (c) mmcalidet contributors. All rights reserved.
from .calibrated_conv import CalibratedConv2d
from .calibrated_linear import CalibratedLinear
from .califormer import CaliFormer
from .prior_ops import flat_prior_like, prior_delta

__all__ = [
    'CaliFormer', 'CalibratedConv2d', 'CalibratedLinear', 'flat_prior_like',
    'prior_delta'
]
