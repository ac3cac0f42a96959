# Copyright (c) mmcalidet contributors. All rights reserved.
from .decoder_cache_preprocessor import (DecoderCachePreprocessor,
                                         is_cached_batch)

__all__ = ['DecoderCachePreprocessor', 'is_cached_batch']
