# Copyright (c) mmcalidet contributors. All rights reserved.
from ..utils.deprecation import deprecated_names
from .decoder_cache import DecoderCacheDataset

__all__ = ['DecoderCacheDataset']

#: old names (deprecated, one release): the cache is built by
#: :mod:`mmcalidet.decoder_cache`
__getattr__ = deprecated_names(__name__, {
    'build_decoder_cache': ('mmcalidet.decoder_cache', 'build_decoder_cache')
})
