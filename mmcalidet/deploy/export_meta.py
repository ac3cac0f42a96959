# Copyright (c) mmcalidet contributors. All rights reserved.
"""What an ONNX export stores for its runtime: the metadata entry
(:data:`META_KEY`) with the class names, input size, normalisation, head
kind and deployment prior (:func:`model_export_meta`), the post-processing
settings of a one- or two-stage graph, and its reading
(:func:`read_export_meta`)."""
import json
from typing import Dict, Optional, Tuple

import numpy as np
from torch import Tensor, nn

from .dense_postprocess import postprocess_settings
from .roi_postprocess import roi_postprocess_settings

#: the metadata key of the runtime's settings
META_KEY = 'mmcalidet'


def model_head_kind(model: nn.Module):
    """The adapter of ``model``'s head kind
    (:func:`~mmcalidet.models.head_kinds.head_kind_of`).

    Raises:
        ValueError: a detector of no known kind.
    """
    from ..models.head_kinds import find_head_kind
    kind = find_head_kind(model)
    if kind is None:
        raise ValueError(
            f'the ONNX export takes DETR-family, one-stage and two-stage '
            f'detectors, got {type(model).__name__}')
    return kind


def head_kind(model: nn.Module) -> str:
    """What an export of ``model`` ends at: ``'dense'`` (every location),
    ``'roi'`` (every RoI) or ``'detr'`` (the detections): its head kind's
    ``export_name``."""
    return model_head_kind(model).export_name


def dense_export_settings(model: nn.Module, wrapper: nn.Module) -> Dict:
    """What the runtime's post-processing of a one-stage graph reads: the
    head's ``test_cfg`` settings and the locations of each level."""
    return dict(
        postprocess=postprocess_settings(model.bbox_head.test_cfg),
        level_sizes=wrapper.level_sizes())


def roi_export_settings(model: nn.Module, wrapper: nn.Module) -> Dict:
    """What the runtime's post-processing of a two-stage graph reads: the
    RoI head's ``test_cfg`` settings."""
    return dict(postprocess=roi_postprocess_settings(model.roi_head.test_cfg))


def deployment_support(model: nn.Module) -> Tuple[Optional[Tensor], ...]:
    """The model's deployment (support, marginals), or ``(None, None)``."""
    if hasattr(model, 'deployment_support'):
        return model.deployment_support()
    return None, None


def export_support_input(model: nn.Module, prior_input: bool) -> bool:
    """Whether a prior-input graph also takes the prior's support (a
    support-aware CaliFormer, experimental)."""
    return bool(prior_input and getattr(model, 'reads_prior_support', False))


def model_export_meta(model: nn.Module, input_shape: Tuple[int, int],
                      prior_input: bool) -> Dict:
    """The runtime's settings of an exported model.

    Args:
        model (nn.Module): the detector.
        input_shape (tuple[int, int]): ``(H, W)``.
        prior_input (bool): the graph takes the prior.

    Returns:
        dict: ``classes``, ``input_shape``, ``mean``, ``std``,
        ``bgr_to_rgb``, ``prior_input``, ``num_classes``, ``head`` (see
        :func:`head_kind`), ``prior`` (the
        deployment prior of a prior-input graph, the folded one
        otherwise), ``model`` (its type), ``support_input`` and the
        deployment prior's ``prior_support`` / ``prior_marginals`` (lists,
        or ``None``: no support).
    """
    from ..priors.prior_source import model_classes
    pre = model.data_preprocessor
    mean = getattr(pre, 'mean', None)
    std = getattr(pre, 'std', None)
    classes = model_classes(model)
    prior = getattr(model, 'folded_prior', None)
    if prior is None and hasattr(model, 'get_prior'):
        prior = model.get_prior()
    return dict(
        format=1,
        model=type(model).__name__,
        classes=list(classes) if classes else None,
        num_classes=int(model_head_kind(model).head(model).num_classes),
        head=head_kind(model),
        input_shape=[int(v) for v in input_shape],
        mean=None if mean is None else mean.flatten().tolist(),
        std=None if std is None else std.flatten().tolist(),
        bgr_to_rgb=bool(getattr(pre, '_channel_conversion', False)),
        prior_input=bool(prior_input),
        folded=getattr(model, 'folded_prior', None) is not None,
        prior=None if prior is None else np.asarray(prior).tolist(),
        support_input=export_support_input(model, prior_input),
        **{
            name: None if value is None else value.detach().cpu().tolist()
            for name, value in zip(('prior_support', 'prior_marginals'),
                                   deployment_support(model))
        })


def read_export_meta(onnx_file: str) -> Dict:
    """The runtime's settings stored by :func:`export_onnx`.

    Args:
        onnx_file (str): the exported file.

    Returns:
        dict: see :func:`model_export_meta`.

    Raises:
        ValueError: the file is not an mmcalidet export.
    """
    import onnx
    graph = onnx.load(onnx_file, load_external_data=False)
    for entry in graph.metadata_props:
        if entry.key == META_KEY:
            return json.loads(entry.value)
    raise ValueError(f'{onnx_file} has no {META_KEY} metadata: export it '
                     'with tools/deployment/export_onnx.py')
