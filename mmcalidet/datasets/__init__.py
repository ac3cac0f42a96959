# Copyright (c) mmcalidet contributors. All rights reserved.
from ..decoder_cache import build_decoder_cache  # noqa: F401
from .decoder_cache import DecoderCacheDataset  # noqa: F401
