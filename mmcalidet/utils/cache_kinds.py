# Copyright (c) mmcalidet contributors. All rights reserved.
"""The kinds of decoder cache and the errors of one: what the cache
(:mod:`mmcalidet.decoder_cache`), its dataset
(:class:`~mmcalidet.datasets.DecoderCacheDataset`) and the calibrator
trained on it (:class:`~mmcalidet.models.detectors.CachedCalibrationMixin`)
say alike.

It lives below them all so that the models name no part of the cache
package: :mod:`mmcalidet.decoder_cache` runs the models (their head-kind
adapters), never the other way round.
"""
from typing import Dict, Optional

#: the kinds of cache (``meta['head']``): decoder queries, dense locations,
#: a two-stage box head's sampled RoIs
HEADS = ('decoder', 'dense', 'roi')
#: the kinds whose caches hold ``targets.npy``
TARGET_HEADS = ('dense', 'roi')
#: what each kind of cache holds, in words (errors name both kinds)
HEAD_WORDS = dict(
    decoder='a DETR\'s decoder queries',
    dense='a one-stage head\'s locations',
    roi='a two-stage box head\'s RoIs')
#: the metainfo key of a training item's data sample that names the kind
#: of cache it came from (:class:`~mmcalidet.datasets.DecoderCacheDataset`)
HEAD_METAINFO = 'cache_head'
#: the metainfo key that names the cache folder it came from
FOLDER_METAINFO = 'cache_dir'


class CacheError(ValueError):
    """A decoder cache file that is missing, torn or garbled.

    Args:
        path (str): the file.
        problem (str): what is wrong with it.
    """

    def __init__(self, path: str, problem: Optional[str] = None) -> None:
        # one argument: a message as it is (a data-loader worker re-raises
        # the error from its text)
        super().__init__(path if problem is
                         None else f'decoder cache file {path}: {problem}')
        self.path = path
        self.problem = problem


class CacheKindError(CacheError, TypeError):
    """A cache of another kind (``meta['head']``) or feature width than a
    model trains on: a ``CacheError`` (one line from the tools) and a
    ``TypeError`` (the batch does not fit the model)."""


def head_kind(meta: Dict) -> str:
    """The kind of a cache (``meta['head']``; a format-2 cache, which
    records none, is a decoder cache).

    Args:
        meta (dict): the content of ``meta.json``.

    Returns:
        str: one of :data:`HEADS`.
    """
    return meta.get('head') or 'decoder'


def kind_text(kind: str) -> str:
    """``'a dense cache (a one-stage head's locations)'``: a kind of cache
    in words.

    Args:
        kind (str): one of :data:`HEADS`.

    Returns:
        str: the words.
    """
    words = HEAD_WORDS.get(kind)
    return f'a {kind} cache' + (f' ({words})' if words else '')
