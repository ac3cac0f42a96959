# Copyright (c) mmcalidet contributors. All rights reserved.
from .califormer import CaliFormer
from .prior_ops import flat_prior_like, prior_delta

__all__ = ['CaliFormer', 'flat_prior_like', 'prior_delta']
