# Copyright (c) mmcalidet contributors. All rights reserved.
from .transforms import *  # noqa: F401,F403
from .decoder_cache import DecoderCacheDataset, build_decoder_cache  # noqa: F401
