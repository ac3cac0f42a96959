# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibrator's training set: a config's training images run once
through a trained detector (every decoder layer; a one- or two-stage
head's cached locations or RoIs, its head kind's cache writer), into a
cache folder reused while its fingerprint holds."""
import os.path as osp
from typing import Callable, Dict, Optional, Sequence

from ..utils.validation import check_int
from .fingerprint import cache_fingerprint
from .reuse import open_or_make
from .store import DecoderCache
from .writer import DecoderCacheWriter


def train_fingerprint(config: str,
                      checkpoint: str,
                      passes: int = 1,
                      indices: Optional[Sequence[int]] = None,
                      batch_size: int = 8,
                      dtype: str = 'float32',
                      layers: str = 'all',
                      seed: Optional[int] = None,
                      num_locations: Optional[int] = None) -> Dict:
    """The fingerprint of a training-set cache
    (:func:`build_decoder_cache`'s arguments; ``num_locations`` recorded
    where given)."""
    if passes < 1:
        raise ValueError(f'passes must be >= 1, got {passes}')
    if dtype not in ('float32', 'float16'):
        raise ValueError(f'dtype must be float32 or float16, got {dtype!r}')
    num_locations = check_int(
        'num_locations', num_locations, 1, allow_none=True)
    fingerprint = cache_fingerprint(config, checkpoint, 'train', passes,
                                    indices, batch_size, dtype, layers, seed)
    if num_locations is not None:
        fingerprint['num_locations'] = num_locations
    return fingerprint


def build_decoder_cache(config: str,
                        checkpoint: str,
                        cache_dir: str,
                        passes: int = 1,
                        indices: Optional[Sequence[int]] = None,
                        batch_size: int = 8,
                        dtype: str = 'float32',
                        device: str = 'cpu',
                        progress: bool = True,
                        seed: Optional[int] = None,
                        layers: str = 'all',
                        num_locations: Optional[int] = None) -> DecoderCache:
    """Run a trained detector over its training set (the config's
    ``train_dataloader.dataset``, training pipeline) and cache the hidden
    states and boxes of every decoder layer with the ground truth, into
    ``cache_dir`` (replaced atomically; see :class:`DecoderCacheWriter`).

    The head kind's cache writer fills it
    (:attr:`~mmcalidet.models.head_kinds.HeadKind.cache_writer`): a
    one-stage detector (RTMDet, FCOS) gets a dense head's cache, per image
    the classification features and targets of its positive and
    ``num_locations`` - positives sampled negative locations
    (:func:`~mmcalidet.decoder_cache.dense.fill_dense_cache`); a
    two-stage one (Faster R-CNN) a box head's cache, the RoIs its training
    sampler draws, padded to ``num_locations`` (default the sampler's
    ``num``; :func:`~mmcalidet.decoder_cache.roi.fill_roi_cache`).

    The detector runs in eval mode (no denoising queries, batch-norm
    statistics frozen). With a random training pipeline each of
    ``passes`` passes sees other augmentations (``seed`` makes them
    repeatable).

    Args:
        config (str): the detector's config (a plain DINO or a CaliDINO).
        checkpoint (str): its trained checkpoint.
        cache_dir (str): the cache folder to make.
        passes (int): passes over the training set. Defaults to 1.
        indices (Sequence[int], optional): cache only these images of the
            training set.
        batch_size (int): images per forward. Defaults to 8.
        dtype (str): ``'float32'`` or ``'float16'`` (hidden states).
        device (str): where the detector runs.
        progress (bool): show a progress bar.
        seed (int, optional): random seed of the augmentations.
        layers (str): ``'all'`` decoder layers (training) or ``'last'``.
        num_locations (int, optional): a one-stage detector's cached
            locations per image (default
            :data:`~mmcalidet.decoder_cache.dense.DEFAULT_NUM_LOCATIONS`),
            a two-stage detector's RoIs (default its sampler's ``num``).

    Returns:
        DecoderCache: the cache.
    """
    fingerprint = train_fingerprint(config, checkpoint, passes, indices,
                                    batch_size, dtype, layers, seed,
                                    num_locations)
    return _make_train_cache(config, checkpoint, cache_dir, fingerprint,
                             device, progress)


def _make_train_cache_aside(*args) -> DecoderCache:
    """:func:`_make_train_cache` with the caller's random generators left
    as found (a training run that makes its cache initialises as one that
    reuses it)."""
    from ..utils.random_state import preserved_random_state
    with preserved_random_state():
        return _make_train_cache(*args)


def _make_train_cache(config: str, checkpoint: str, cache_dir: str,
                      fingerprint: Dict, device: str,
                      progress: bool) -> DecoderCache:
    from mmdet.registry import DATASETS
    from mmengine.dataset import pseudo_collate

    from ..apis.inference import init_detector
    from ..priors.prior_source import model_classes
    model = init_detector(config, checkpoint, device=device)
    dataset = DATASETS.build(model.cfg.train_dataloader.dataset)
    indices = fingerprint['indices']
    order = list(range(len(dataset))) if indices is None else indices
    if not order:
        raise ValueError(f'{config}: the training set is empty')
    bad = [i for i in order if not 0 <= i < len(dataset)]
    if bad:
        raise ValueError(f'indices out of range for the training set of '
                         f'{len(dataset)} images: {bad[:5]}')
    entries = order * fingerprint['passes']
    if fingerprint['seed'] is not None:
        from mmengine.runner import set_random_seed
        set_random_seed(fingerprint['seed'])
    size = fingerprint['batch_size']
    batches = (
        pseudo_collate([dataset[i] for i in entries[s:s + size]])
        for s in range(0, len(entries), size))
    classes = model_classes(model)
    writer = DecoderCacheWriter(
        cache_dir,
        fingerprint=fingerprint,
        dtype=fingerprint['dtype'],
        layers=fingerprint['layers'],
        classes=list(classes) if classes else None,
        info=dict(
            config_path=osp.abspath(config),
            checkpoint_path=osp.abspath(checkpoint)))
    from ..models.head_kinds import head_kind_of
    kind = head_kind_of(model)
    return kind.part('cache_writer')(
        model,
        batches,
        writer,
        fingerprint.get('num_locations'),
        seed=fingerprint['seed'],
        progress=progress,
        total=len(entries),
        desc=f'{kind.name} cache (train)')


def ensure_decoder_cache(cache_dir: str,
                         config: str,
                         checkpoint: str,
                         passes: int = 1,
                         indices: Optional[Sequence[int]] = None,
                         batch_size: int = 8,
                         dtype: str = 'float32',
                         device: str = 'cpu',
                         progress: bool = True,
                         seed: Optional[int] = None,
                         layers: str = 'all',
                         force: bool = False,
                         logger: Optional[Callable[[str], None]] = None,
                         num_locations: Optional[int] = None) -> tuple:
    """The training-set cache of ``cache_dir`` where it is complete and of
    this source, else made again (:func:`build_decoder_cache`; one line
    says why, naming a torn file or the changed settings).

    Args:
        cache_dir (str): the cache folder.
        config, checkpoint, passes, indices, batch_size, dtype, device,
        progress, seed, layers, num_locations: see
        :func:`build_decoder_cache`.
        force (bool): make it even when current.
        logger (callable, optional): where the message goes.

    Returns:
        tuple[DecoderCache, bool]: the cache and whether it was made.

    Raises:
        ValueError: before the detector runs, a ``cache_dir`` that is a
            file or cannot be written.
    """
    from ..utils.file_io import check_writable_dir
    check_writable_dir(cache_dir, 'decoder cache folder')
    fingerprint = train_fingerprint(config, checkpoint, passes, indices,
                                    batch_size, dtype, layers, seed,
                                    num_locations)

    return open_or_make(
        cache_dir,
        fingerprint,
        lambda: _make_train_cache_aside(config, checkpoint, cache_dir,
                                        fingerprint, device, progress),
        force=force,
        logger=logger)
