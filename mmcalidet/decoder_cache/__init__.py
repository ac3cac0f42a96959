# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs of a DETR-family detector: one format for the
calibrator's training set (every decoder layer) and the evaluation
protocol (the last layer, re-scored under any prior).

The decoder's hidden states and boxes do not depend on the prior (the
encoder's proposal head stays uncalibrated), so they are computed once and
reused. Modules: ``fingerprint`` (what makes a cache), ``baseline`` (the one
checkpoint a calibrator and its cache share), ``folder_format`` (the
folder format and its validation), ``store`` (the :class:`DecoderCache`
reader), ``writer`` (atomic writing), ``private_folders`` (the writers'
private folders, and removing those of dead processes), ``reuse`` (a
folder reused by its fingerprint), ``build`` (running a DETR over any
batches or images), ``train_cache`` (a config's training set, the
calibrator's), and the cache writer of each head kind (named by its adapter,
:mod:`mmcalidet.models.head_kinds`): ``decoder`` (a DETR's decoder
outputs), ``dense`` and ``dense_targets`` (a one-stage head's cached
locations), ``roi`` and ``roi_targets`` (a two-stage box head's sampled
RoIs); ``samples`` and ``npy`` (the stored data samples and arrays).
"""
from ..utils.cache_kinds import CacheError, CacheKindError
from .baseline import TrunkMismatchError, match_baseline, same_checkpoint
from .build import (cache_hidden_states, cache_images, fill_cache,
                    image_batches, run_decoder)
from .dense import (DEFAULT_NUM_LOCATIONS, fill_dense_cache, is_dense_model,
                    run_dense_head)
from .fingerprint import (cache_fingerprint, checkpoint_fingerprint,
                          config_fingerprint, fingerprint_digest,
                          weights_fingerprint)
from .folder_format import CACHE_FORMAT, check_cache
from .private_folders import remove_stale_folders
from .reuse import cache_folder, open_or_make, stale_reasons
from .roi import fill_roi_cache, is_roi_model, run_roi_head
from .samples import strip_data_sample, with_predictions
from .store import DecoderCache
from .train_cache import (build_decoder_cache, ensure_decoder_cache,
                          train_fingerprint)
from .writer import DecoderCacheWriter

__all__ = [
    'DecoderCache', 'DecoderCacheWriter', 'CacheError', 'CacheKindError',
    'CACHE_FORMAT', 'check_cache', 'cache_fingerprint',
    'checkpoint_fingerprint', 'config_fingerprint', 'weights_fingerprint',
    'fingerprint_digest', 'run_decoder', 'fill_cache', 'cache_hidden_states',
    'cache_images', 'image_batches', 'cache_folder', 'open_or_make',
    'stale_reasons', 'build_decoder_cache', 'ensure_decoder_cache',
    'train_fingerprint', 'strip_data_sample', 'with_predictions',
    'remove_stale_folders', 'match_baseline', 'same_checkpoint',
    'TrunkMismatchError', 'fill_dense_cache', 'run_dense_head',
    'is_dense_model', 'DEFAULT_NUM_LOCATIONS', 'fill_roi_cache',
    'run_roi_head', 'is_roi_model'
]
