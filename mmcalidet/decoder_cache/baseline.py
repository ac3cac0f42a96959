# Copyright (c) mmcalidet contributors. All rights reserved.
"""The baseline a calibrator calibrates, named once.

A calibrator trained on cached decoder outputs loads the baseline's
weights (``load_from``: trunk, box branches, W) and learns from the
decoder outputs of the checkpoint its cache was made from
(``train_dataloader.dataset.source.checkpoint``, or the checkpoint an
existing cache records). Were they two detectors, the calibrator would keep
one's decoder and learn the other's outputs, and nothing would fail.
:func:`match_baseline` makes one of the two settings name both, and
refuses two that differ, before anything is built.
"""
import os.path as osp
from typing import Optional

from ..utils.cache_kinds import CacheError
from .fingerprint import checkpoint_fingerprint
from .folder_format import read_meta


class TrunkMismatchError(ValueError):
    """``load_from`` and the decoder cache's checkpoint are two
    detectors."""


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two paths hold the same checkpoint: the same file, or files
    of the same size and SHA-1.

    Args:
        a (str): a checkpoint path.
        b (str): another.

    Returns:
        bool: the same weights (``False`` when either file is missing).
    """
    if osp.realpath(a) == osp.realpath(b):
        return True
    if not (osp.isfile(a) and osp.isfile(b)):
        return False
    if osp.getsize(a) != osp.getsize(b):
        return False
    return checkpoint_fingerprint(a) == checkpoint_fingerprint(b)


def _is_cache_dataset(dataset) -> bool:
    kind = dataset.get('type') if hasattr(dataset, 'get') else None
    return kind == 'DecoderCacheDataset' or getattr(
        kind, '__name__', None) == 'DecoderCacheDataset'


def _cache_checkpoint(cache_dir: str) -> Optional[tuple]:
    """``(fingerprint, path)`` of the checkpoint an existing cache records,
    or ``None`` (no cache, an unreadable meta file, a model without
    checkpoint: the dataset reports those)."""
    try:
        meta = read_meta(cache_dir)
        made = meta['fingerprint']['checkpoint']
        return dict(
            size=made['size'],
            sha1=made['sha1']), meta.get('checkpoint_path',
                                         'a path it does not record')
    except (CacheError, KeyError, TypeError):
        return None


def match_baseline(cfg) -> Optional[str]:
    """Name a calibrator's baseline once: for a config that trains on a
    :class:`~mmcalidet.datasets.DecoderCacheDataset`, fill the cache
    source's ``checkpoint`` from ``load_from`` (or ``load_from`` from it)
    and refuse the two when they are different detectors; without a
    ``source``, compare ``load_from`` with the checkpoint the existing
    cache was made from. Other configs are left as they are.

    Args:
        cfg (Config): the training config, changed in place (before a
            ``--resume`` replaces ``load_from``).

    Returns:
        str | None: the baseline checkpoint, or ``None`` (not a calibrator
        config, or nothing named).

    Raises:
        TrunkMismatchError: one line naming both checkpoints.
    """
    loader = cfg.get('train_dataloader') or {}
    dataset = loader.get('dataset') if hasattr(loader, 'get') else None
    # a dataset wrapper (mmengine's RepeatDataset, say) holds it as dataset
    while hasattr(dataset, 'get') and not _is_cache_dataset(dataset) and \
            hasattr(dataset.get('dataset'), 'get'):
        dataset = dataset.get('dataset')
    if dataset is None or not _is_cache_dataset(dataset):
        return None
    load_from = cfg.get('load_from')
    source = dataset.get('source')
    if source is not None:
        checkpoint = source.get('checkpoint')
        if checkpoint is None:
            if load_from is not None:
                source['checkpoint'] = load_from
            return load_from
        if load_from is None:
            cfg.load_from = checkpoint
            return checkpoint
        if not same_checkpoint(load_from, checkpoint):
            raise TrunkMismatchError(
                f'load_from {load_from} is not the detector the decoder '
                f'cache is made from ({checkpoint}, train_dataloader.'
                'dataset.source.checkpoint): the calibrator would keep one '
                "detector's decoder and learn the other's outputs; name the "
                'baseline once, in load_from')
        return load_from
    made = _cache_checkpoint(dataset.get('cache_dir', ''))
    if load_from is None or made is None or not osp.isfile(load_from):
        return load_from
    fingerprint, path = made
    if osp.getsize(load_from) != fingerprint['size'] or \
            checkpoint_fingerprint(load_from) != fingerprint:
        raise TrunkMismatchError(
            f'load_from {load_from} is not the detector the decoder cache '
            f'{dataset["cache_dir"]} was made from ({path}): the '
            "calibrator would keep one detector's decoder and learn the "
            "other's outputs; load that detector, or make the cache from "
            'this one (its source.checkpoint)')
    return load_from
