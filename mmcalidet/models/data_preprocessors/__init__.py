# Copyright (c) mmcalidet contributors. All rights reserved.
from .decoder_cache_preprocessor import (DecoderCachePreprocessor,
                                         is_cached_batch)
from .edge_sampler import EdgeSampler

__all__ = ['DecoderCachePreprocessor', 'EdgeSampler', 'is_cached_batch']
