# Copyright (c) mmcalidet contributors. All rights reserved.
"""Making decoder caches: run a detector's backbone, transformer and head
once per image and keep the decoder outputs (:class:`DecoderCache`).

* :func:`cache_hidden_states` / :func:`cache_images`: any batches or
  images, in memory or in a cache folder reused by fingerprint (the
  evaluation);
* :func:`build_decoder_cache` / :func:`ensure_decoder_cache`: a config's
  training set from a checkpoint, every layer (the calibrator's training
  set); for a one-stage detector (RTMDet) the positive and sampled
  negative locations of its dense head (:mod:`.dense`), for a two-stage
  one (Faster R-CNN) the RoIs its box head's sampler draws (:mod:`.roi`).
"""
import os.path as osp
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import torch
from mmengine.logging import print_log

from ..utils.progress import progress_bar
from ..utils.validation import check_int
from .fingerprint import (cache_fingerprint, fingerprint_changes,
                          fingerprint_digest)
from .store import CacheError, DecoderCache
from .writer import DecoderCacheWriter, remove_stale_folders


def check_decoder_model(model: torch.nn.Module) -> None:
    """Refuse a detector without a DETR decoder: the caches, and the
    evaluation tools that rescore them, hold decoder outputs.

    Raises:
        TypeError: naming the detector (e.g. a one-stage CaliRTMDet).
    """
    from ..models.head_kinds import DECODER, find_head_kind
    if find_head_kind(model) is not DECODER:
        raise TypeError(
            f'{type(model).__name__} has no DETR decoder: the decoder '
            'caches and the evaluation tools built on them (eval_priors, '
            'fit_site_prior, self_calibrate, the calibrator curve) take '
            'DETR-family detectors only; evaluate a one- or two-stage '
            'CaliDet with tools/test.py and a prior per run')


def run_decoder(model: torch.nn.Module, batch: dict) -> tuple:
    """Preprocess a batch (test mode) and run the backbone, the
    transformer and the head: what the decoder caches hold.

    Args:
        model (nn.Module): a DETR-family detector whose
            ``forward_transformer`` returns ``hidden_states`` and
            ``references`` (DINO, Deformable DETR, their CaliDet versions).
        batch (dict): ``dict(inputs=[...], data_samples=[...])`` as a data
            loader yields it.

    Returns:
        tuple: the preprocessed data samples, the hidden states of every
        decoder layer (L, B, Q, d) and the head's outputs (every layer's
        class logits and normalised boxes).
    """
    data = model.data_preprocessor(batch, False)
    samples = data['data_samples']
    head_inputs = model.forward_transformer(
        model.extract_feat(data['inputs']), samples)
    keys = ('hidden_states', 'references', 'cali_vectors')
    outs = model.bbox_head(
        **{k: head_inputs[k]
           for k in keys if k in head_inputs})
    return samples, head_inputs['hidden_states'], outs


def fill_cache(model: torch.nn.Module,
               data: Iterable[dict],
               writer: DecoderCacheWriter,
               progress: bool = True,
               callback: Optional[Callable] = None,
               before_batch: Optional[Callable] = None,
               total: Optional[int] = None,
               desc: str = 'decoder cache') -> DecoderCache:
    """Run the detector (eval mode, no gradients) over batches into a
    writer and commit it (a failure removes what was written).

    Args:
        model (nn.Module): the detector.
        data (Iterable[dict]): batches as a data loader yields them.
        writer (DecoderCacheWriter): where the outputs go.
        progress (bool): show a progress bar.
        callback (callable, optional): ``callback(batch_id, data_batch,
            outputs)`` after each batch, ``outputs`` the data samples with
            the predictions under the model's current prior (what
            ``model.test_step`` returns).
        before_batch (callable, optional): ``before_batch(batch_id,
            data_batch)`` before each batch.
        total (int, optional): images, for the progress bar.
        desc (str): the progress bar's label.

    Returns:
        DecoderCache: the cache.
    """
    model.eval()
    head = model.bbox_head
    with writer, torch.no_grad(), progress_bar(
            desc=desc, enabled=progress, total=total, unit='img',
            leave=True) as bar:
        for batch_id, batch in enumerate(data):
            if before_batch is not None:
                before_batch(batch_id, batch)
            samples, hidden, outs = run_decoder(model, batch)
            writer.add(hidden, outs[1], samples, batch_id)
            if callback is not None:
                results = head.predict_by_feat(
                    *outs,
                    batch_img_metas=[ds.metainfo for ds in samples],
                    rescale=True)
                callback(batch_id, batch,
                         model.add_pred_to_datasample(samples, results))
            bar.update(len(samples))
        return writer.commit()


def cache_folder(cache_dir: str, fingerprint: Dict) -> str:
    """The folder of ``cache_dir`` that holds the cache of a fingerprint
    (``decoder_cache-<digest>``): another checkpoint, config, image set or
    batch size gets another folder."""
    return osp.join(cache_dir,
                    f'decoder_cache-{fingerprint_digest(fingerprint)}')


def _open_current(folder: str, fingerprint: Dict) -> tuple:
    """The cache of ``folder`` if complete and of ``fingerprint`` (else
    ``None``), and why not."""
    if not osp.isdir(folder):
        return None, ['no cache']
    try:
        cache = DecoderCache.open(folder)
    except CacheError as exc:
        return None, [f'{osp.basename(exc.path)} {exc.problem}']
    changes = fingerprint_changes(cache.fingerprint, fingerprint)
    return (None if changes else cache), changes


def stale_reasons(folder: str, fingerprint: Dict) -> List[str]:
    """Why ``folder`` does not hold a complete cache of ``fingerprint``.

    Args:
        folder (str): the cache folder.
        fingerprint (dict): what the cache should be made of
            (:func:`~mmcalidet.decoder_cache.cache_fingerprint`).

    Returns:
        list[str]: empty when the cache is current; else ``'no cache'``,
        ``'<file> <problem>'`` for a missing, torn or garbled file, or
        ``'KEY changed'`` for each entry of the fingerprint that differs.
    """
    return _open_current(folder, fingerprint)[1]


def _log(message: str, logger: Optional[Callable[[str], None]]) -> None:
    if logger is None:
        print_log(message, logger='current')
    else:
        logger(message)


def open_or_make(folder: str,
                 fingerprint: Dict,
                 make: Callable[[], DecoderCache],
                 force: bool = False,
                 logger: Optional[Callable[[str], None]] = None) -> tuple:
    """The cache of ``folder`` where it is complete and of ``fingerprint``,
    else the one ``make()`` returns (it writes ``folder`` through a
    :class:`DecoderCacheWriter`); a one-line message says why an existing
    folder is made again. Either way the private folders that killed
    builds left beside it (``.<name>.partial-<pid>-...`` of a process no
    longer alive, :func:`~.writer.remove_stale_folders`) are removed first,
    each named in a message.

    Args:
        folder (str): the cache folder.
        fingerprint (dict): what the cache is made of.
        make (callable): makes the cache.
        force (bool): make it even when current.
        logger (callable, optional): where the message goes (default
            mmengine's current logger).

    Returns:
        tuple[DecoderCache, bool]: the cache and whether it was made.
    """
    for path in remove_stale_folders(osp.dirname(osp.realpath(folder))):
        _log(f'removed the stale decoder cache folder {path}', logger)
    cache, reasons = (None, ['remade on request']) if force else \
        _open_current(folder, fingerprint)
    if cache is not None:
        cache.reused = True
        return cache, False
    if osp.isdir(folder):
        _log(
            f'decoder cache {folder}: {", ".join(reasons)}; making it '
            'again', logger)
    return make(), True


def cache_hidden_states(
        model: torch.nn.Module,
        data: Iterable[dict],
        cache_dir: Optional[str] = None,
        fingerprint: Optional[Dict] = None,
        dtype='float32',
        layers: str = 'last',
        progress: bool = True,
        callback: Optional[Callable] = None,
        before_batch: Optional[Callable] = None,
        logger: Optional[Callable[[str], None]] = None) -> DecoderCache:
    """Run backbone + transformer once per image and cache the decoder
    outputs (by default the last layer's, what the evaluation scores).

    Where the cache lives:

    * no ``cache_dir``: in memory;
    * ``cache_dir`` and ``fingerprint``: the folder :func:`cache_folder`
      of ``cache_dir``, reused without running the detector when complete
      and of the same fingerprint (``callback`` is then not called), made
      (or replaced) atomically otherwise;
    * ``cache_dir`` only: a private folder there, removed when the cache
      is garbage-collected (never reused).

    Args:
        model (nn.Module): the detector (put in eval mode here).
        data (Iterable[dict]): batches as a data loader yields them.
        cache_dir (str, optional): see above.
        fingerprint (dict, optional): what makes the cache (see
            :func:`~mmcalidet.decoder_cache.cache_fingerprint`).
        dtype (str | torch.dtype): stored type of the hidden states
            (``float16``: half the size, scores then differ from a full
            forward by the rounding).
        layers (str): ``'last'`` or ``'all'`` decoder layers.
        progress (bool): show a progress bar.
        callback (callable, optional): see :func:`fill_cache`.
        before_batch (callable, optional): see :func:`fill_cache`.
        logger (callable, optional): where reuse and remake messages go.

    Returns:
        DecoderCache: the cache, images in the data's order.
    """
    check_decoder_model(model)
    dataset = getattr(data, 'dataset', None)
    total = len(dataset) if dataset is not None else None
    classes = (getattr(model, 'dataset_meta', None) or {}).get('classes')
    kwargs = dict(dtype=dtype, layers=layers, classes=classes)

    def make(writer: DecoderCacheWriter) -> DecoderCache:
        return fill_cache(model, data, writer, progress, callback,
                          before_batch, total)

    if cache_dir is None or fingerprint is None:
        return make(DecoderCacheWriter(spill_dir=cache_dir, **kwargs))
    folder = cache_folder(cache_dir, fingerprint)
    cache, _ = open_or_make(
        folder,
        fingerprint,
        lambda: make(
            DecoderCacheWriter(folder, fingerprint=fingerprint, **kwargs)),
        logger=logger)
    return cache


def image_batches(model: torch.nn.Module,
                  images: Sequence,
                  batch_size: int = 1,
                  pipeline=None) -> Iterator[dict]:
    """Batches of images (file paths or HxWx3 BGR arrays) through the
    model's test pipeline, as :func:`mmdet.apis.inference_detector`
    prepares them.

    Args:
        model (nn.Module): a detector with ``cfg`` (``init_detector``).
        images (Sequence[str | np.ndarray]): the images.
        batch_size (int): images per batch.
        pipeline (Callable, optional): a test pipeline to use instead.

    Yields:
        dict: ``dict(inputs=[...], data_samples=[...])``.
    """
    if pipeline is None:
        from ..apis.inference import build_test_pipeline
        if getattr(model, 'cfg', None) is None:
            raise ValueError('the model has no cfg (build it with '
                             'mmdet.apis.init_detector) and no pipeline '
                             'was given')
        pipeline = build_test_pipeline(
            model.cfg,
            bool(len(images)) and isinstance(images[0], np.ndarray))
    for start in range(0, len(images), batch_size):
        batch = dict(inputs=[], data_samples=[])
        for k in range(start, min(start + batch_size, len(images))):
            img = images[k]
            item = dict(
                img=img, img_id=k) if isinstance(img, np.ndarray) else dict(
                    img_path=img, img_id=k)
            item = pipeline(item)
            batch['inputs'].append(item['inputs'])
            batch['data_samples'].append(item['data_samples'])
        yield batch


def cache_images(model: torch.nn.Module,
                 images: Sequence,
                 batch_size: int = 1,
                 pipeline=None,
                 **kwargs) -> DecoderCache:
    """:func:`cache_hidden_states` over images (paths or arrays).

    Args:
        model (nn.Module): a detector with ``cfg`` (or pass ``pipeline``).
        images (Sequence[str | np.ndarray]): the images.
        batch_size (int): images per forward.
        pipeline (Callable, optional): the test pipeline.
        **kwargs: passed to :func:`cache_hidden_states`.

    Returns:
        DecoderCache: the cache, images in the given order.
    """
    kwargs.setdefault('progress', False)
    return cache_hidden_states(
        model, image_batches(model, images, batch_size, pipeline), **kwargs)


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
    """
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
