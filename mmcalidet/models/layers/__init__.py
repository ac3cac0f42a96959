# Copyright (c) mmcalidet contributors. All rights reserved.
from .prior_ops import flat_prior_like, prior_delta

__all__ = ['flat_prior_like', 'prior_delta']
