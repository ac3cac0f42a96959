# Copyright (c) mmcalidet contributors. All rights reserved.
"""The decoder kind's cache writer: a DETR's training cache holds every
query of every decoder layer (:func:`~.build.fill_cache`)."""
from typing import Iterable, Optional

import torch

from .build import fill_cache
from .store import DecoderCache
from .writer import DecoderCacheWriter


def fill_decoder_cache(model: torch.nn.Module,
                       data: Iterable[dict],
                       writer: DecoderCacheWriter,
                       num_locations: Optional[int] = None,
                       seed: Optional[int] = None,
                       progress: bool = True,
                       total: Optional[int] = None,
                       desc: str = 'decoder cache') -> DecoderCache:
    """:func:`fill_cache` as the decoder kind's cache writer
    (:attr:`~mmcalidet.models.head_kinds.HeadKind.cache_writer`): a
    training cache of every query of every decoder layer.

    Args:
        model, data, writer, progress, total, desc: see
            :func:`fill_cache`.
        num_locations (int, optional): unused: a decoder cache holds every
            query.
        seed (int, optional): unused: nothing is drawn.

    Returns:
        DecoderCache: the cache.
    """
    return fill_cache(model, data, writer, progress, total=total, desc=desc)
