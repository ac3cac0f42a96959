# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs of a trained detector, as a training set for the
calibrator (the CaliFormer, optionally the classification branches).

The decoder's hidden states and boxes do not depend on the prior: DINO's
encoder proposal head stays uncalibrated, so ``E`` only reaches the
classification logits ``(W + rho V')^T h + b``. A CaliDet calibrator can
therefore train on the hidden states of every decoder layer, computed once
by a frozen baseline, instead of a full forward/backward of the detector.

The cache folder has the one format of :mod:`mmcalidet.decoder_cache`
(made by :func:`~mmcalidet.decoder_cache.build_decoder_cache`, validated
on open). Size: ``N * L * Q * (d * itemsize + 16)`` bytes, e.g. the tiny
context-shift DINO (2,000 images, 2 layers, 30 queries, d = 256) 125 MB in
float32; DINO-4scale on COCO train (117k images, 6 layers, 900 queries)
330 GB in float16: cache a subset of images (``indices``) there.
"""
import os.path as osp
from typing import Dict, Optional, Union

from mmdet.registry import DATASETS
from mmdet.structures import DetDataSample
from mmengine.dist import barrier, get_rank
from torch.utils.data import Dataset

from ..decoder_cache import DecoderCache, ensure_decoder_cache
from ..utils.cache_kinds import FOLDER_METAINFO, HEAD_METAINFO, head_kind

#: the ``source`` keys :func:`ensure_decoder_cache` takes
SOURCE_KEYS = ('config', 'checkpoint', 'passes', 'indices', 'batch_size',
               'dtype', 'device', 'progress', 'seed', 'layers',
               'num_locations')


@DATASETS.register_module()
class DecoderCacheDataset(Dataset):
    """Cached decoder outputs (every decoder layer) with the ground truth,
    for training a calibrator on a frozen detector.

    Each item is ``dict(inputs=dict(hidden_states=(L, Q, d), bbox_preds=(L,
    Q, 4)), data_samples=DetDataSample)`` with ``gt_instances`` and the
    metainfo the losses read (a one-stage head's cache adds the locations'
    ``targets`` (Q, 4) to ``inputs``, a two-stage box head's the RoIs');
    :class:`DecoderCachePreprocessor` batches them and draws the priors.
    Each data sample names the kind of cache (``cache_head``, the cache's
    ``meta['head']``) and its folder (``cache_dir``): a calibrator refuses
    a cache of another kind than its head's
    (:class:`~mmcalidet.decoder_cache.CacheKindError`).

    Args:
        cache_dir (str): the cache folder.
        source (dict, optional): how to make the cache when the folder is
            missing, torn or stale: ``config`` and ``checkpoint`` of the
            trained detector (``checkpoint`` left out of a config:
            tools/train.py gives it ``load_from``, see
            :func:`~mmcalidet.decoder_cache.match_baseline`), and
            optionally ``passes``, ``indices``,
            ``batch_size``, ``dtype``, ``device``, ``progress``, ``seed``,
            ``layers``, ``num_locations`` (a one-stage detector's cached
            locations per image) (see :func:`~mmcalidet.decoder_cache.
            build_decoder_cache`). Without it the folder must hold a
            complete cache (a missing or torn file raises a
            ``ValueError`` naming it).
        metainfo (dict, optional): dataset metainfo (``classes``);
            defaults to the classes stored in the cache.
    """

    def __init__(self,
                 cache_dir: str,
                 source: Optional[Dict] = None,
                 metainfo: Optional[Dict] = None) -> None:
        super().__init__()
        self.cache_dir = cache_dir
        if source is not None:
            self._ensure(dict(source))
        if not osp.isdir(cache_dir):
            raise FileNotFoundError(
                f'no decoder cache in {cache_dir}: give the dataset a '
                '`source=dict(config=..., checkpoint=...)` to make it, or '
                'run tools/analysis_tools/cache_decoder_outputs.py')
        self.cache = DecoderCache.open(cache_dir)
        self.meta = self.cache.meta
        self._metainfo = dict(metainfo or {})
        if 'classes' not in self._metainfo and self.cache.classes:
            self._metainfo['classes'] = self.cache.classes

    def _ensure(self, source: Dict) -> None:
        if 'config' not in source:
            raise ValueError(f"DecoderCacheDataset: source needs 'config', "
                             f'got {sorted(source)}')
        if source.get('checkpoint') is None:
            raise ValueError(
                "DecoderCacheDataset: source needs 'checkpoint' (the "
                'detector the cache is made from); tools/train.py takes it '
                'from load_from, and a Runner built otherwise needs it '
                'given: mmcalidet.decoder_cache.match_baseline(cfg) fills it')
        unknown = sorted(set(source) - set(SOURCE_KEYS))
        if unknown:
            raise ValueError(f'DecoderCacheDataset: unknown source keys '
                             f'{unknown}; known: {list(SOURCE_KEYS)}')
        if get_rank() == 0:
            ensure_decoder_cache(self.cache_dir, **source)
        barrier()

    @property
    def metainfo(self) -> Dict:
        """Dataset metainfo (``classes``), as mmengine datasets have."""
        return dict(self._metainfo)

    @property
    def num_layers(self) -> int:
        """L, the cached decoder layers."""
        return self.cache.num_layers

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> Dict[str, Union[Dict, DetDataSample]]:
        hidden, boxes = self.cache.layers_of(index)
        inputs = dict(hidden_states=hidden, bbox_preds=boxes)
        targets = self.cache.targets_of(index)
        if targets is not None:
            inputs['targets'] = targets
        sample = self.cache.data_sample(index)
        # what made the item: the calibrator checks it is its head's kind
        sample.set_metainfo({
            HEAD_METAINFO: head_kind(self.meta),
            FOLDER_METAINFO: self.cache_dir
        })
        return dict(inputs=inputs, data_samples=sample)
