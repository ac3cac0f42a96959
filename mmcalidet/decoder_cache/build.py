# Copyright (c) mmcalidet contributors. All rights reserved.
"""Making decoder caches of any batches or images: run a DETR's backbone,
transformer and head once per image and keep the decoder outputs
(:class:`DecoderCache`), in memory or in a cache folder reused by
fingerprint (:mod:`.reuse`): :func:`cache_hidden_states` /
:func:`cache_images`, what the evaluation re-scores.

The calibrator's training set, a config's training images through a
trained detector of any head kind, is :mod:`.train_cache`'s.
"""
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from ..utils.progress import progress_bar
from .reuse import cache_folder, open_or_make
from .store import DecoderCache
from .writer import DecoderCacheWriter


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
