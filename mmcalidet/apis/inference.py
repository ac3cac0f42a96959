# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmdet's ``init_detector`` / ``inference_detector`` with a prior.

A prior given to a call applies to that call only: it travels in the data
samples (``data_sample.prior``), which override the model's deployment
prior for those images, so the model's own prior (and its cached V') is
never touched. ``model.set_prior(...)`` changes the model's default.
"""
import copy
import os
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn
from mmcv.transforms import Compose
from mmdet.apis import inference_detector as mmdet_inference_detector
from mmdet.apis import init_detector as mmdet_init_detector
from mmdet.evaluation import get_classes
from mmdet.structures import DetDataSample, SampleList
from mmdet.utils import get_test_pipeline_cfg
from mmengine.config import Config

from ..models.detectors import defer_class_matching
from ..priors.prior import Prior
from ..utils.checkpoint import (build_with_checked_checkpoint,
                                checkpoint_names_classes)
from ..utils.validation import check_device
from .image_inputs import check_inference_images

ImagesType = Union[str, np.ndarray, Sequence[str], Sequence[np.ndarray]]
#: one prior: a prior file, a shipped name, a dict or a K x K matrix
PriorType = Union[str, os.PathLike, dict, np.ndarray, torch.Tensor,
                  Sequence[Sequence[float]]]


def is_calibratable(model: nn.Module) -> bool:
    """Whether ``model`` takes a prior (a CaliDet detector): it resolves
    and sets priors, and its calibrated head (``calibrated_head``, else
    the ``bbox_head``) turns priors into V' (the one test, used by the
    inference API and the evaluation alike)."""
    head = getattr(model, 'calibrated_head', None)
    if head is None:
        head = getattr(model, 'bbox_head', None)
    return hasattr(model, 'resolve_prior') and hasattr(
        model, 'set_prior') and hasattr(head, 'get_cali_vectors')


def _is_one_prior(prior: Any) -> bool:
    """Whether an item of a list is a whole prior, not a matrix row."""
    if prior is None or isinstance(prior, (str, os.PathLike, dict, Prior)):
        return True
    ndim = getattr(prior, 'ndim', None)
    if ndim is None and isinstance(prior, (list, tuple)):
        try:
            ndim = np.ndim(prior)
        except ValueError:  # ragged: not a matrix row of numbers
            return False
    return ndim == 2


def per_image_priors(prior: Any) -> Optional[list]:
    """The per-image priors of a call, or ``None`` for one shared prior.

    Args:
        prior: one prior for every image (a file, a shipped name, a dict,
            a K x K array, tensor or nested list), or one per image: a
            list/tuple of those (``None`` items keep the model's prior for
            that image) or a (B, K, K) array/tensor.

    Returns:
        list | None: the per-image priors, or ``None`` if ``prior`` is one
        prior for all images.
    """
    if getattr(prior, 'ndim', None) == 3:
        return list(prior)
    if isinstance(prior, (list, tuple)) and prior and \
            all(_is_one_prior(p) for p in prior):
        return list(prior)
    return None


def resolve_call_priors(model: nn.Module, prior: Any,
                        num_images: int) -> List[Optional[Prior]]:
    """Validate the priors of an inference call before the model runs.

    Every prior is made once (a file is read once however many images
    share it) with the model's :meth:`resolve`: reordered by class name to
    the model's classes (``model.dataset_meta['classes']``) and validated,
    its support included; nothing in the model changes.

    Args:
        model (nn.Module): a calibratable detector (e.g. ``CaliDINO``).
        prior: one prior or one per image (see :func:`per_image_priors`).
        num_images (int): the number of images of the call.

    Returns:
        list[Prior | None]: a :class:`~mmcalidet.priors.Prior` per image
        (the same object where images share a prior), ``None`` where the
        model's deployment prior applies.

    Raises:
        ValueError: if the model is not calibratable, if a per-image list
            does not have one prior per image, or naming the first bad
            prior (and, in a per-image list, its image).
    """
    if not is_calibratable(model):
        raise ValueError('a prior needs a calibratable detector (CaliDet, '
                         f'e.g. CaliDINO), got {type(model).__name__}')
    sources = per_image_priors(prior)
    if sources is None:
        return [model.resolve(prior)] * num_images
    if len(sources) != num_images:
        raise ValueError(f'got {len(sources)} priors for {num_images} '
                         'images: give one prior for all images or one per '
                         'image')
    resolved: dict = {}
    priors = []
    for index, src in enumerate(sources):
        if src is None:
            priors.append(None)
            continue
        key = os.fspath(src) if isinstance(src, (str, os.PathLike)) \
            else id(src)
        if key not in resolved:
            try:
                resolved[key] = model.resolve(src)
            except ValueError as exc:
                raise ValueError(f'prior of image {index}: {exc}') from exc
        priors.append(resolved[key])
    return priors


def call_prior_fields(model: nn.Module,
                      priors: Sequence[Optional[Prior]]
                      ) -> List[Optional[dict]]:
    """The data sample fields that carry each call prior to its image:
    ``prior`` (K x K float32) and, for a model whose CaliFormer reads a
    support (experimental), the support the prior records
    (``prior_support``, ``prior_marginals``).

    Args:
        model (nn.Module): the CaliDet detector.
        priors (Sequence[Prior | None]): from :func:`resolve_call_priors`.

    Returns:
        list[dict | None]: the fields per image (one dict per distinct
        prior), ``None`` where the model's prior applies.
    """
    reads_support = getattr(model, 'reads_prior_support', False)
    made: dict = {}
    out = []
    for prior in priors:
        if prior is None:
            out.append(None)
            continue
        if id(prior) not in made:
            fields = dict(prior=torch.from_numpy(np.array(
                prior.matrix)).float())
            if reads_support and prior.has_support:
                fields.update(
                    prior_support=torch.from_numpy(np.array(
                        prior.support)).float(),
                    prior_marginals=torch.from_numpy(np.array(
                        prior.marginals)).float())
            made[id(prior)] = fields
        out.append(made[id(prior)])
    return out


def attach_call_prior(data_sample: Any, fields: Optional[dict]) -> None:
    """Put a call's prior (and its support) in a data sample, where they
    override the model's deployment prior for that image.

    Args:
        data_sample (DetDataSample): the image's data sample.
        fields (dict, optional): from :func:`call_prior_fields`; ``None``
            leaves the model's prior.
    """
    for field, value in (fields or {}).items():
        data_sample.set_field(value, field)


def config_classes(cfg: Config) -> Optional[List[str]]:
    """The class names a config's datasets state (``metainfo.classes`` of
    the test, val or train dataset, the first that has them), or ``None``.

    Args:
        cfg (Config): a detector config.

    Returns:
        list[str] | None: the class names.
    """
    for split in ('test', 'val', 'train'):
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        while isinstance(dataset, dict):
            classes = (dataset.get('metainfo') or {}).get('classes')
            if classes:
                return list(classes)
            dataset = dataset.get('dataset')  # wrappers (RepeatDataset)
    return None


def init_detector(config: Union[str, Path, Config],
                  checkpoint: Optional[str] = None,
                  palette: str = 'none',
                  device: str = 'cuda:0',
                  cfg_options: Optional[dict] = None,
                  prior: Optional[PriorType] = None) -> nn.Module:
    """mmdet's ``init_detector``, plus a deployment prior.

    The checkpoint restores the prior it was saved with (its ``prior``
    buffer); ``prior`` replaces it, reordered by class name to the
    checkpoint's classes. Without a checkpoint the model is initialised
    with ``init_weights()`` (mmdet's ``init_detector`` leaves it as built,
    and the DETR family creates ``level_embed`` uninitialised: it can hold
    NaN). Importing this module registers mmcalidet, so
    CaliDet configs and checkpoints load. The class names
    (``dataset_meta``) are the checkpoint's; where it names none (no
    checkpoint, or a hand-saved ``dict(state_dict=...)``), the config's
    dataset classes, and only then COCO's, as mmdet names them.

    Unlike mmdet's, a checkpoint that does not fit the model is an error
    (as in ``tools/test.py``): tensors of other shapes (another class
    count), a plain detector's checkpoint in a CaliDet model, missing
    tensors; so is an invalid stored prior or an unreadable file.

    Args:
        config (str | Path | Config): config file or object.
        checkpoint (str, optional): checkpoint file; ``None`` keeps the
            config's initial weights (``init_weights``).
        palette (str): see mmdet's ``init_detector``.
        device (str): the device. Defaults to ``'cuda:0'`` as mmdet's.
        cfg_options (dict, optional): config overrides.
        prior (optional): the deployment prior to inject after loading (a
            prior file, a shipped name such as ``'coco2017_val'``, a dict
            or a K x K matrix); ``None`` keeps the checkpoint's.

    Returns:
        nn.Module: the detector in eval mode.

    Raises:
        CheckpointError: (a ``ValueError``) naming the checkpoint file and
            what is wrong with it.
        ValueError: a device torch cannot use (CUDA on a CPU-only torch),
            before anything is built.
    """
    check_device(device)

    def build(ckpt, contents):
        # a copy each time: mmdet's builder edits model configs
        cfg = copy.deepcopy(config) if isinstance(config, Config) else config
        # mmdet names COCO's classes when there is no checkpoint or its
        # meta names none (a hand-saved state dict): take the config's
        # dataset classes instead where it names them
        with defer_class_matching():
            model = mmdet_init_detector(
                cfg, ckpt, palette=palette, device=device,
                cfg_options=cfg_options)
        meta = dict(model.dataset_meta)
        if not checkpoint_names_classes(contents):
            classes = config_classes(model.cfg) or meta.get('classes')
            if not classes:  # e.g. a checkpoint with an empty dataset_meta
                warnings.warn(
                    'neither the checkpoint nor the config names the '
                    'classes: using COCO\'s 80 class names, as mmdet does')
                classes = list(get_classes('coco'))
            meta['classes'] = classes
        # set after the block: a CaliDet matches its named priors to these
        model.dataset_meta = meta
        return model

    model = build_with_checked_checkpoint(build, checkpoint)
    if checkpoint is None:
        model.init_weights()
    if prior is not None:
        if not is_calibratable(model):
            raise ValueError('prior needs a calibratable detector (CaliDet), '
                             f'got {type(model).__name__}')
        model.set_prior(prior)
    return model


def build_test_pipeline(cfg: Config, ndarray_inputs: bool) -> Compose:
    """The test pipeline mmdet's ``inference_detector`` builds by default.

    Args:
        cfg (Config): the model's config (``model.cfg``).
        ndarray_inputs (bool): load images from arrays instead of files.

    Returns:
        Compose: the pipeline.
    """
    pipeline = copy.deepcopy(get_test_pipeline_cfg(cfg))
    if ndarray_inputs:
        pipeline[0].type = 'mmdet.LoadImageFromNDArray'
    return Compose(pipeline)


class _AttachPrior:
    """A test pipeline that also puts a call prior's fields (the prior and
    its support) in the data sample."""

    def __init__(self, pipeline: Callable, fields: dict) -> None:
        self.pipeline = pipeline
        self.fields = fields

    def __call__(self, data: dict) -> dict:
        data = self.pipeline(data)
        attach_call_prior(data['data_samples'], self.fields)
        return data


def inference_detector(model: nn.Module,
                       imgs: ImagesType,
                       prior: Any = None,
                       test_pipeline: Optional[Compose] = None,
                       **kwargs) -> Union[DetDataSample, SampleList]:
    """Inference image(s) with the detector, under a prior.

    mmdet's ``inference_detector`` with one more argument. All priors are
    validated before the model runs; a bad one raises and nothing runs.

    Args:
        model (nn.Module): the loaded detector (see :func:`init_detector`).
        imgs (str | ndarray | Sequence[str | ndarray]): image files or
            loaded images.
        prior (optional): ``None`` (default) uses the model's current
            prior (the checkpoint's E_t, or what ``model.set_prior`` set).
            Otherwise the prior of this call only: a prior file (``.json``
            reordered by class name, or ``.npy``), a shipped name, a dict,
            a K x K array/tensor, or one such prior per image (a list, or a
            (B, K, K) array/tensor; ``None`` items use the model's prior).
        test_pipeline (Compose, optional): as mmdet's.
        **kwargs: passed to mmdet's ``inference_detector``
            (``text_prompt``, ``custom_entities``).

    Returns:
        DetDataSample | list[DetDataSample]: as mmdet's: a list if
        ``imgs`` is a list or tuple.

    Raises:
        ValueError: on bad images, before the model runs (no images,
            files mixed with arrays, a missing, empty or broken file, an
            array that is not H x W x 3 or holds NaN:
            :func:`~.image_inputs.check_inference_images`), on a bad prior
            (shape, K, values, diagonal, unknown class names, number of
            per-image priors), or a prior for a detector that is not
            calibratable.
    """
    is_batch = isinstance(imgs, (list, tuple))
    images = check_inference_images(imgs)
    fields = call_prior_fields(
        model, resolve_call_priors(model, prior, len(images))) \
        if prior is not None else None
    if test_pipeline is None and images:
        # built here from a copy: mmdet's default edits ``model.cfg`` for
        # array inputs, which breaks later calls with file names
        test_pipeline = build_test_pipeline(model.cfg,
                                            isinstance(images[0], np.ndarray))
    if fields is None:
        return mmdet_inference_detector(model, imgs, test_pipeline, **kwargs)
    results = []
    for img, img_fields in zip(images, fields):
        pipeline = test_pipeline if img_fields is None \
            else _AttachPrior(test_pipeline, img_fields)
        results.append(
            mmdet_inference_detector(model, img, pipeline, **kwargs))
    return results if is_batch else results[0]
