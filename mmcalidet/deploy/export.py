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
deployment prior) is stored in the file's metadata (``mmcalidet``), so an
ONNX Runtime user needs neither mmdet nor the config. A one-stage graph
ends at every location's boxes and scores, a two-stage one at every
RoI's (:mod:`~mmcalidet.deploy.two_stage_export`): the runtime runs their
last NMS.
"""
import contextlib
import copy
import json
import math
import os
import os.path as osp
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from mmdet.structures import DetDataSample
from torch import Tensor, nn

from .dense_postprocess import postprocess_settings
from .roi_postprocess import roi_postprocess_settings
from .traced_forward import TracedForward

#: the metadata key of the runtime's settings
META_KEY = 'mmcalidet'
#: the ONNX opset (grid_sample: 16)
OPSET = 17


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
    """
    value = model.resolve(prior)
    folded = copy.deepcopy(model).eval()
    folded.set_prior(value)
    kind = model_head_kind(folded)
    with torch.no_grad():
        kind.fold(kind.head(folded), folded.deployment_cali_vectors())
    folded.folded_prior = np.array(value.matrix)
    return folded


def input_sample(height: int, width: int) -> DetDataSample:
    """The data sample of one unpadded ``height x width`` input (what the
    traced forward and its checks give the detector).

    Args:
        height (int): H.
        width (int): W.

    Returns:
        DetDataSample: its metainfo only.
    """
    return DetDataSample(
        metainfo=dict(
            img_shape=(height, width),
            ori_shape=(height, width),
            pad_shape=(height, width),
            batch_input_shape=(height, width),
            scale_factor=(1.0, 1.0)))


class ExportWrapper(TracedForward):
    """The traced forward: one normalised image (and the prior) in,
    ``dets`` and ``labels`` out.

    Args:
        model (nn.Module): the detector (eval mode).
        input_shape (tuple[int, int]): ``(H, W)`` of the graph's input.
        prior_input (bool): the prior is the graph's second input; else
            the model's own (deployment or folded) prior applies.
        support_input (bool): the prior's support and class shares are
            the third and fourth inputs (a support-aware CaliFormer; a row
            of zeros: no support).
    """

    def __init__(self,
                 model: nn.Module,
                 input_shape: Tuple[int, int],
                 prior_input: bool,
                 support_input: bool = False) -> None:
        super().__init__(model, input_shape, prior_input, support_input)

    def forward(self,
                input: Tensor,
                prior: Optional[Tensor] = None,
                support: Optional[Tensor] = None,
                marginals: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        sample = input_sample(*self.input_shape)
        if self.prior_input:
            sample.prior = prior
        if self.support_input:
            sample.prior_support = support
            sample.prior_marginals = marginals
        result = self.model.predict(input, [sample], rescale=False)[0]
        pred = result.pred_instances
        dets = torch.cat([pred.bboxes, pred.scores[:, None]], dim=1)
        return dets, pred.labels


class DenseExportWrapper(TracedForward):
    """The traced forward of a one-stage detector: one normalised image
    (and the prior) in, every location's ``boxes`` (N x 4, clipped to the
    input) and class ``scores`` (N x K, after the sigmoid) out, the levels
    one after the other, and for a head whose scores are multiplied by a
    factor after the top-k (FCOS's centerness) the ``score_factors`` (N,
    after the sigmoid). The NMS runs in the runtime
    (:mod:`~mmcalidet.deploy.dense_postprocess`), as mmdeploy leaves it to
    a backend's op: ONNX has no class-aware NMS that keeps mmdet's order.

    Args:
        model (nn.Module): the detector (eval mode), with a sigmoid dense
            head whose boxes are distances from points (RTMDet's, FCOS's).
        input_shape (tuple[int, int]): ``(H, W)`` of the graph's input.
        prior_input (bool): the prior is the graph's second input.
        support_input (bool): its support and class shares are the third
            and fourth.
    """

    def __init__(self,
                 model: nn.Module,
                 input_shape: Tuple[int, int],
                 prior_input: bool,
                 support_input: bool = False) -> None:
        head = model.bbox_head
        if not getattr(head, 'use_sigmoid_cls', False) or \
                type(head.bbox_coder).__name__ != 'DistancePointBBoxCoder':
            raise ValueError(
                'the ONNX export of a one-stage detector needs a sigmoid '
                'head with point-distance boxes (RTMDet, FCOS), got '
                f'{type(head).__name__}')
        super().__init__(model, input_shape, prior_input, support_input)
        from ..models.head_kinds import DENSE

        #: the graph's outputs
        self.output_names = ('boxes', 'scores') + (
            ('score_factors', ) if DENSE.has_score_factors(head) else ())

    def forward(self,
                input: Tensor,
                prior: Optional[Tensor] = None,
                support: Optional[Tensor] = None,
                marginals: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        model, head = self.model, self.model.bbox_head
        cali = self.cali_vectors(head, prior, support, marginals)
        feats = model.extract_feat(input)
        outs = head(feats) if cali is None else head(feats, cali)
        cls_scores, bbox_preds = outs[:2]
        points = head.prior_generator.grid_priors(
            [score.shape[-2:] for score in cls_scores],
            dtype=input.dtype,
            device=input.device)
        boxes, scores = [], []
        for cls_score, bbox_pred, level_points in zip(cls_scores, bbox_preds,
                                                      points):
            distances = bbox_pred[0].permute(1, 2, 0).reshape(-1, 4)
            boxes.append(head.bbox_coder.decode(level_points, distances))
            scores.append(cls_score[0].permute(1, 2, 0).reshape(
                -1, head.cls_out_channels).sigmoid())
        boxes = torch.cat(boxes)
        height, width = self.input_shape
        boxes = torch.stack([
            boxes[:, 0].clamp(0, width), boxes[:, 1].clamp(0, height),
            boxes[:, 2].clamp(0, width), boxes[:, 3].clamp(0, height)
        ], 1)
        if len(self.output_names) == 2:
            return boxes, torch.cat(scores)
        factors = torch.cat(
            [factor[0].reshape(-1).sigmoid() for factor in outs[2]])
        return boxes, torch.cat(scores), factors

    def level_sizes(self) -> List[int]:
        """The locations of each level at the graph's input size."""
        head = self.model.bbox_head
        height, width = self.input_shape
        return [
            int(math.ceil(height / stride[1]) * math.ceil(width / stride[0]))
            for stride in head.prior_generator.strides
        ]


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
        ValueError: a prior input asked of a detector without a prior.
    """
    import onnx
    if prior_input and not hasattr(model, 'resolve_prior'):
        raise ValueError(f'{type(model).__name__} takes no prior: export it '
                         'without a prior input')
    if prior_input and getattr(model, 'folded_prior', None) is not None:
        raise ValueError('a folded model has its prior in its weights: '
                         'export it without a prior input')
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
