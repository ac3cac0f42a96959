# Copyright (c) mmcalidet contributors. All rights reserved.
from .edge_sampler import EdgeSampler

__all__ = ['EdgeSampler']
