# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export of a DETR-family, one-stage or two-stage detector, a CaliDet
one with its prior as a graph input or folded into the classifier weights.

The graph takes one image of a fixed size ``H x W`` after the model's
normalisation (``input``: 1 x 3 x H x W) and, unless the prior is folded,
the prior (``prior``: K x K float32); it returns mmdeploy's detection
outputs, ``dets`` (N x 5: x1, y1, x2, y2 in the input's pixels, score) and
``labels`` (N). The CaliFormer runs inside the graph. The export traces
the PyTorch model with ``torch.onnx`` (the TorchScript exporter): on the
CPU, mmcv's multi-scale deformable attention takes its PyTorch path
(``grid_sample``), which ONNX has from opset 16.

What the runtime needs (class names, input size, normalisation, the
deployment prior) is stored in the file's metadata (``mmcalidet``,
:mod:`~mmcalidet.deploy.export_meta`), so an ONNX Runtime user needs
neither mmdet nor the config. A one-stage graph ends at every location's
boxes and scores, a two-stage one at every RoI's
(:mod:`~mmcalidet.deploy.two_stage_export`): the runtime runs their last
NMS. The modules traced are :mod:`~mmcalidet.deploy.export_wrappers`'s
(and the two-stage one); this module folds a prior and writes the file.
"""
import contextlib
import copy
import json
import os
import os.path as osp
import warnings
from typing import Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..utils.validation import check_int
from .export_meta import (META_KEY, deployment_support, export_support_input,
                          model_export_meta, model_head_kind)

#: the ONNX opset (grid_sample: 16)
OPSET = 17


def fold_prior(model: nn.Module, prior) -> nn.Module:
    """A copy of a CaliDet detector with V' of ``prior`` folded into its
    classification weights (``W + rho * V'`` in every classification layer
    of its head kind, :meth:`~mmcalidet.models.head_kinds.HeadKind.fold`:
    each decoder layer's branch, each level's classification conv, a box
    head's classifier), and no calibration left to compute (the plain
    detector's cost).

    V' is what ``model.set_prior(prior)`` gives: the prior's support, where
    it records one and the CaliFormer reads it, included.

    Args:
        model (nn.Module): a calibratable detector.
        prior: what :meth:`resolve` of the model takes (a
            :class:`~mmcalidet.priors.Prior`, a file, a shipped name, a
            K x K matrix, a dict).

    Returns:
        nn.Module: the folded copy (eval mode); ``model`` is unchanged.

    Raises:
        ValueError: a detector that takes no prior (a plain mmdet one), or
            what :meth:`resolve` refuses.
    """
    from ..apis.inference import is_calibratable
    if not is_calibratable(model):
        raise ValueError(f'fold_prior needs a calibratable detector '
                         f'(CaliDet), got {type(model).__name__}: it has no '
                         'prior to fold')
    value = model.resolve(prior)
    folded = copy.deepcopy(model).eval()
    folded.set_prior(value)
    kind = model_head_kind(folded)
    with torch.no_grad():
        kind.fold(kind.head(folded), folded.deployment_cali_vectors())
    folded.folded_prior = np.array(value.matrix)
    return folded


def pad_size_divisor(model: nn.Module) -> int:
    """The multiple mmdet's data preprocessor pads a batch to (its
    ``pad_size_divisor``; 1: no padding)."""
    preprocessor = getattr(model, 'data_preprocessor', None)
    return max(int(getattr(preprocessor, 'pad_size_divisor', 1) or 1), 1)


def padded_shape(shape: Tuple[int, int], divisor: int) -> Tuple[int, int]:
    """``(H, W)`` rounded up to multiples of ``divisor``, as mmdet pads."""
    return tuple(-(-int(v) // divisor) * divisor for v in shape)


def check_input_shape(input_shape) -> Tuple[int, int]:
    """``(H, W)`` of an export: two integers >= 1.

    Raises:
        ValueError: one line naming the shape given.
    """
    try:
        height, width = input_shape
        height = check_int('input_shape H', height, 1)
        return height, check_int('input_shape W', width, 1)
    except (TypeError, ValueError):
        raise ValueError('input_shape must be (H, W), two integers >= 1, '
                         f'got {input_shape!r}') from None


def padding_problem(model: nn.Module,
                    input_shape: Tuple[int, int]) -> Optional[str]:
    """Why a graph of ``input_shape`` would not give what PyTorch gives
    on the same resized image, or ``None``: mmdet's data preprocessor pads
    an H x W input to multiples of its ``pad_size_divisor`` (the padding
    reaches the features, the anchors and a DETR's mask), the graph takes
    H x W as it is.

    Args:
        model (nn.Module): the detector.
        input_shape (tuple[int, int]): ``(H, W)``.

    Returns:
        str | None: one line naming the shape, the divisor and a shape
        that works; ``None`` when the divisor divides both.
    """
    divisor = pad_size_divisor(model)
    height, width = (int(v) for v in input_shape)
    if height % divisor == 0 and width % divisor == 0:
        return None
    good = padded_shape((height, width), divisor)
    return (f'an input of {height} x {width} is not what the model sees: '
            f'its data_preprocessor pads to multiples of {divisor} '
            f'(pad_size_divisor), so the graph would differ from PyTorch; '
            f'export at {good[0]} x {good[1]} (multiples of {divisor})')


def export_wrapper(model: nn.Module, input_shape: Tuple[int, int],
                   prior_input: bool, support_input: bool) -> nn.Module:
    """The module :func:`export_onnx` traces for ``model``'s kind of head
    (its adapter's ``export_wrapper``).

    Raises:
        ValueError: a detector of another kind.
    """
    wrapper = model_head_kind(model).part('export_wrapper')
    return wrapper(model, input_shape, prior_input, support_input)


def export_onnx(model: nn.Module,
                out: str,
                input_shape: Tuple[int, int] = (256, 256),
                prior_input: bool = True,
                opset: int = OPSET) -> str:
    """Export a detector to ONNX (written atomically: an interrupted export
    leaves no file at ``out``).

    Args:
        model (nn.Module): the detector, a CaliDet one for
            ``prior_input`` (a :func:`fold_prior` copy: ``False``).
        out (str): the ``.onnx`` file.
        input_shape (tuple[int, int]): ``(H, W)`` of the input.
        prior_input (bool): make the prior the graph's second input.
        opset (int): the ONNX opset (>= 16).

    Returns:
        str: ``out``.

    Raises:
        ValueError: a prior input asked of a detector without a prior, an
            ``input_shape`` that is not two integers >= 1 or that the
            model's ``pad_size_divisor`` does not divide
            (:func:`padding_problem`), an ``opset`` below 16.
    """
    import onnx
    input_shape = check_input_shape(input_shape)
    check_int('opset', opset, 16)
    if prior_input and not hasattr(model, 'resolve_prior'):
        raise ValueError(f'{type(model).__name__} takes no prior: export it '
                         'without a prior input')
    if prior_input and getattr(model, 'folded_prior', None) is not None:
        raise ValueError('a folded model has its prior in its weights: '
                         'export it without a prior input')
    problem = padding_problem(model, input_shape)
    if problem:
        raise ValueError(problem)
    model = model.eval()
    height, width = (int(v) for v in input_shape)
    support_input = export_support_input(model, prior_input)
    wrapper = export_wrapper(model, (height, width), prior_input,
                             support_input)
    kind = model_head_kind(model)
    device = next(model.parameters()).device
    image = torch.zeros(1, 3, height, width, device=device)
    args: tuple = (image, )
    names = ['input']
    if prior_input:
        args += (torch.as_tensor(
            model.get_prior(), dtype=torch.float32, device=device), )
        names.append('prior')
    if support_input:
        k = int(kind.head(model).num_classes)
        support, marginals = deployment_support(model)
        args += tuple(
            torch.ones(k, device=device) if t is None else t.to(device)
            for t in (support, marginals))
        names += ['prior_support', 'prior_marginals']
    elif hasattr(model, 'deployment_cali_vectors'):
        with torch.no_grad():
            model.deployment_cali_vectors()  # a constant of the graph
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    partial = f'{out}.partial-{os.getpid()}'
    try:
        rewrites = kind.part('export_rewrites')(model) if \
            kind.export_rewrites else contextlib.nullcontext()
        with torch.no_grad(), warnings.catch_warnings(), rewrites:
            warnings.simplefilter('ignore')
            torch.onnx.export(
                wrapper,
                args,
                partial,
                input_names=names,
                output_names=list(
                    getattr(wrapper, 'output_names', kind.export_outputs)),
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False)
        graph = onnx.load(partial)
        entry = graph.metadata_props.add()
        entry.key = META_KEY
        meta = model_export_meta(model, (height, width), prior_input)
        if kind.export_settings:
            meta.update(kind.part('export_settings')(model, wrapper))
        entry.value = json.dumps(meta)
        onnx.save(graph, partial)
        os.replace(partial, out)
    finally:
        if osp.exists(partial):
            os.remove(partial)
    return out
