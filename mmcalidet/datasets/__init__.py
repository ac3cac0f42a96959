# Copyright (c) mmcalidet contributors. All rights reserved.
import os

from ..utils.deprecation import deprecated_names

if os.environ.get('MMCALIDET_LIGHT', '0') != '1':
    # registration; the light mode (label converters, priors) skips torch
    # and mmdet, and imports the dataset on first use instead
    from .decoder_cache import DecoderCacheDataset  # noqa: F401

__all__ = ['DecoderCacheDataset']

#: old names (deprecated, one release): the cache is built by
#: :mod:`mmcalidet.decoder_cache`
_deprecated = deprecated_names(__name__, {
    'build_decoder_cache': ('mmcalidet.decoder_cache', 'build_decoder_cache')
})


def __getattr__(name: str):
    """``DecoderCacheDataset`` on first use in the light mode; the
    deprecated names."""
    if name == 'DecoderCacheDataset':
        from .decoder_cache import DecoderCacheDataset
        return DecoderCacheDataset
    return _deprecated(name)
