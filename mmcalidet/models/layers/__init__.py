# Copyright (c) mmcalidet contributors. All rights reserved.
from .calibrated_conv import CalibratedConv2d
from .califormer import CaliFormer
from .prior_ops import flat_prior_like, prior_delta

__all__ = ['CaliFormer', 'CalibratedConv2d', 'flat_prior_like', 'prior_delta']
