# Copyright (c) mmcalidet contributors. All rights reserved.
from .decoder_cache import DecoderCacheDataset, build_decoder_cache  # noqa: F401
