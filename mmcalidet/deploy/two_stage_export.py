# Copyright (c) mmcalidet contributors. All rights reserved.
"""The traced forward of a two-stage detector (Faster R-CNN's RPN and
standard RoI head): one normalised image (and the prior) in, every RoI's
per-class ``boxes`` (N x K x 4) and class ``scores`` (N x K, the softmax
without the background) out. The RoI head's class-aware NMS runs in the
runtime (:mod:`~mmcalidet.deploy.roi_postprocess`), as the one-stage
export leaves its own; the RPN's NMS is in the graph (ONNX's
``NonMaxSuppression``).

The number of RoIs (N) is the input's, not the trace's: the RPN keeps
as many proposals as its NMS leaves, at most ``max_per_img``, and every
reshape, expand and slice along them takes -1 or a size read in the graph
(a size taken in Python, ``len(tensor)``, would be a constant of the
trace). mmdet's RPN and RoI head run as they are, with four rewrites for
the trace's duration only (as mmdeploy's rewriters do):

- mmcv's NMS gets an ONNX symbolic (the standard ``NonMaxSuppression``);
- the RPN's post-processing drops boxes below ``min_bbox_size`` by a mask
  on every input (mmdet skips the mask when no box is small: a branch the
  tracer would freeze at the trace input's) and runs one level-aware NMS
  whatever the number of boxes (mmcv's ``batched_nms`` branches on it);
- the RoI extractor pools every RoI on every level and keeps each RoI's
  own level by a mask (mmdet skips empty levels: a frozen branch too),
  with RoIAlign exported as ONNX's own (half-pixel, opset 16);
- the box coders decode with mmdet's ``delta2bbox`` (their export branch
  imports mmdet 2.x's ``mmdet.core``), a row of zeros beside the boxes so
  that no RoI decodes too.
"""
import contextlib
import types
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor, nn

from .traced_forward import TracedForward


def _const(g, value, dtype: torch.dtype):
    return g.op('Constant', value_t=torch.tensor(value, dtype=dtype))


def nms_symbolic(g, boxes, scores, iou_threshold: float, offset: int,
                 score_threshold: float, max_num: int):
    """mmcv's ``NMSop`` as ONNX's ``NonMaxSuppression`` (one batch, one
    class): the kept indices, best score first, as mmcv's."""
    if offset != 0:
        raise ValueError('ONNX NonMaxSuppression has no box offset, got '
                         f'offset={offset}')
    inputs = [
        g.op('Unsqueeze', boxes, _const(g, [0], torch.long)),
        g.op('Unsqueeze', scores, _const(g, [0, 1], torch.long)),
        _const(g, [max_num if max_num > 0 else 2**31 - 1], torch.long),
        _const(g, [float(iou_threshold)], torch.float32)
    ]
    if score_threshold > 0:
        inputs.append(_const(g, [float(score_threshold)], torch.float32))
    selected = g.op('NonMaxSuppression', *inputs)
    return g.op('Gather', selected, _const(g, 2, torch.long), axis_i=1)


class RoIAlignOnnx(torch.autograd.Function):
    """mmcv's average RoIAlign, exported as ONNX's ``RoiAlign`` with the
    coordinate transformation of opset 16 (mmcv's own symbolic shifts
    aligned RoIs itself, as opset 10 needed: at opset 16 the shift would
    be applied twice)."""

    @staticmethod
    def forward(ctx, feat: Tensor, rois: Tensor, output_size: tuple,
                spatial_scale: float, sampling_ratio: int,
                aligned: bool) -> Tensor:
        from mmcv.ops import roi_align
        return roi_align(feat, rois, output_size, spatial_scale,
                         sampling_ratio, 'avg', aligned)

    @staticmethod
    def symbolic(g, feat, rois, output_size, spatial_scale, sampling_ratio,
                 aligned):
        batch = g.op(
            'Cast',
            g.op('Gather', rois, _const(g, 0, torch.long), axis_i=1),
            to_i=7)  # INT64
        boxes = g.op(
            'Gather', rois, _const(g, [1, 2, 3, 4], torch.long), axis_i=1)
        return g.op(
            'RoiAlign',
            feat,
            boxes,
            batch,
            coordinate_transformation_mode_s='half_pixel'
            if aligned else 'output_half_pixel',
            mode_s='avg',
            output_height_i=int(output_size[0]),
            output_width_i=int(output_size[1]),
            sampling_ratio_i=max(0, int(sampling_ratio)),
            spatial_scale_f=float(spatial_scale))


def masked_levels_forward(extractor: nn.Module,
                          feats: Tuple[Tensor, ...],
                          rois: Tensor,
                          roi_scale_factor: Optional[float] = None) -> Tensor:
    """``SingleRoIExtractor.forward`` without data-dependent branches:
    every RoI pooled on every level, each kept on its own level
    (``map_roi_levels``) by a mask.

    Args:
        extractor (nn.Module): the RoI extractor.
        feats (tuple[Tensor]): the levels' features.
        rois (Tensor): (N, 5) RoIs, the image index first.
        roi_scale_factor (float, optional): as mmdet's.

    Returns:
        Tensor: (N, C, h, w) the RoIs' features.
    """
    rois = rois.type_as(feats[0])
    levels = extractor.map_roi_levels(rois, len(feats))
    if roi_scale_factor is not None:
        rois = extractor.roi_rescale(rois, roi_scale_factor)
    out = 0
    for level, (feat, layer) in enumerate(zip(feats, extractor.roi_layers)):
        pooled = RoIAlignOnnx.apply(feat, rois, tuple(layer.output_size),
                                    layer.spatial_scale, layer.sampling_ratio,
                                    layer.aligned)
        mask = (levels == level).to(pooled.dtype)
        out = out + pooled * mask.view(-1, 1, 1, 1)
    return out


def rpn_post_process(rpn_head: nn.Module,
                     results,
                     cfg,
                     rescale: bool = False,
                     with_nms: bool = True,
                     img_meta: Optional[dict] = None):
    """``RPNHead._bbox_post_process`` of one unscaled input without
    data-dependent branches: boxes below ``min_bbox_size`` masked out,
    the level-aware NMS (mmcv's ``batched_nms``: the levels set apart by
    an offset), the best ``max_per_img``. Any number of boxes (none
    included) takes the same ops: mmcv's NMS of each level apart from
    ``split_thr`` boxes on, and ``max()`` of no box, are left out.

    Args:
        rpn_head (nn.Module): the RPN.
        results (InstanceData): the decoded ``bboxes``, ``scores`` and
            ``level_ids`` of the input's best anchors.
        cfg (dict): the RPN's ``test_cfg``.
        rescale (bool): must be ``False``.
        with_nms (bool): unused (the RPN's NMS always runs).
        img_meta (dict, optional): unused.

    Returns:
        InstanceData: the proposals, best first.

    Raises:
        ValueError: a rescaled input, or an NMS other than mmcv's ``nms``.
    """
    from mmcv.ops import nms
    from mmdet.structures.bbox import get_box_wh
    if rescale:
        raise ValueError('the traced RPN takes an unscaled input')
    nms_cfg = dict(cfg.nms)
    if nms_cfg.pop('type', 'nms') != 'nms':
        raise ValueError(f'the traced RPN runs mmcv\'s plain nms, got '
                         f'{cfg.nms["type"]!r}')
    nms_cfg.pop('split_thr', None)
    if cfg.get('min_bbox_size', -1) >= 0:
        width, height = get_box_wh(results.bboxes)
        results = results[(width > cfg.min_bbox_size)
                          & (height > cfg.min_bbox_size)]
    boxes = results.bboxes
    if not nms_cfg.pop('class_agnostic', False):
        # mmcv's offsets; the zero beside the boxes (clipped to the
        # input: their maximum is >= 0) gives max() a value without any
        top = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
        boxes = boxes + (results.level_ids.to(boxes) * (top + 1))[:, None]
    dets, keep = nms(boxes, results.scores, **nms_cfg)
    results = results[keep]
    results.scores = dets[:, -1]
    return results[:cfg.max_per_img]


def delta_decode(coder: nn.Module,
                 bboxes: Tensor,
                 pred_bboxes: Tensor,
                 max_shape: Optional[tuple] = None,
                 wh_ratio_clip: float = 16 / 1000) -> Tensor:
    """``DeltaXYWHBBoxCoder.decode``'s eager path (mmdet's
    ``delta2bbox``) for 2-D deltas, of any number of boxes: ``delta2bbox``
    reshapes its result to ``(rows, -1)``, which ONNX Runtime cannot do
    with no row; a row of zeros is decoded beside the boxes and left out.

    Args:
        coder (nn.Module): the box coder.
        bboxes (Tensor): (N, 4) the boxes (anchors or RoIs).
        pred_bboxes (Tensor): (N, 4 * C) their deltas.
        max_shape (tuple, optional): ``(H, W)`` to clip to.
        wh_ratio_clip (float): as mmdet's.

    Returns:
        Tensor: (N, 4 * C) the decoded boxes.
    """
    from mmdet.models.task_modules.coders.delta_xywh_bbox_coder import \
        delta2bbox
    decoded = delta2bbox(
        torch.cat([bboxes, bboxes.new_zeros(1, bboxes.size(1))]),
        torch.cat([pred_bboxes,
                   pred_bboxes.new_zeros(1, pred_bboxes.size(1))]),
        coder.means, coder.stds, max_shape, wh_ratio_clip, coder.clip_border,
        coder.add_ctr_clamp, coder.ctr_clamp)
    return decoded[:-1]


def _check_type(what: str, part: nn.Module, supported: str) -> None:
    """Refuse a part of another type than the trace rewrites cover."""
    if type(part).__name__ != supported:
        raise ValueError(f'the ONNX export of a two-stage detector takes a '
                         f'{supported} as {what}, got {type(part).__name__}')


def check_two_stage_export(model: nn.Module) -> None:
    """Refuse a two-stage detector the traced forward does not cover,
    naming the part.

    Raises:
        ValueError: another RPN, RoI extractor, box coder or pooling.
    """
    roi_head = model.roi_head
    _check_type('rpn_head', model.rpn_head, 'RPNHead')
    _check_type("the RPN's bbox_coder", model.rpn_head.bbox_coder,
                'DeltaXYWHBBoxCoder')
    _check_type('bbox_roi_extractor', roi_head.bbox_roi_extractor,
                'SingleRoIExtractor')
    _check_type("the box head's bbox_coder", roi_head.bbox_head.bbox_coder,
                'DeltaXYWHBBoxCoder')
    for layer in roi_head.bbox_roi_extractor.roi_layers:
        if type(layer).__name__ != 'RoIAlign' or layer.pool_mode != 'avg':
            raise ValueError('the ONNX export of a two-stage detector pools '
                             f'with an average RoIAlign, got {layer}')
    if getattr(roi_head.bbox_head, 'custom_cls_channels', False):
        raise ValueError('the ONNX export of a two-stage detector takes a '
                         'softmax box head (no custom classification)')


@contextlib.contextmanager
def two_stage_rewrites(model: nn.Module) -> Iterator[None]:
    """Inside the block, ``model``'s RPN, RoI extractor and box coders and
    mmcv's NMS trace to ONNX (see the module); everything is restored on
    leaving it.

    Args:
        model (nn.Module): a two-stage detector
            (:func:`check_two_stage_export` passes).
    """
    from mmcv.ops.nms import NMSop
    check_two_stage_export(model)
    rpn = model.rpn_head
    extractor = model.roi_head.bbox_roi_extractor
    patched = [(rpn, '_bbox_post_process', rpn_post_process),
               (extractor, 'forward', masked_levels_forward),
               (rpn.bbox_coder, 'decode', delta_decode),
               (model.roi_head.bbox_head.bbox_coder, 'decode', delta_decode)]
    had_symbolic = 'symbolic' in vars(NMSop)
    try:
        if not had_symbolic:
            NMSop.symbolic = staticmethod(nms_symbolic)
        for owner, name, function in patched:
            setattr(owner, name, types.MethodType(function, owner))
        yield
    finally:
        for owner, name, _ in patched:
            vars(owner).pop(name, None)
        if not had_symbolic:
            del NMSop.symbolic


class RoIExportWrapper(TracedForward):
    """The traced forward of a two-stage detector (see the module).

    Args:
        model (nn.Module): the detector (eval mode).
        input_shape (tuple[int, int]): ``(H, W)`` of the graph's input.
        prior_input (bool): the prior is the graph's second input; else
            the model's own (deployment or folded) prior applies.
        support_input (bool): its support and class shares are the third
            and fourth.
    """

    def __init__(self,
                 model: nn.Module,
                 input_shape: Tuple[int, int],
                 prior_input: bool,
                 support_input: bool = False) -> None:
        check_two_stage_export(model)
        super().__init__(model, input_shape, prior_input, support_input)

    def forward(self,
                input: Tensor,
                prior: Optional[Tensor] = None,
                support: Optional[Tensor] = None,
                marginals: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Every RoI's per-class boxes and class scores.

        Args:
            input (Tensor): (1, 3, H, W) the normalised image.
            prior (Tensor, optional): (K, K) a prior input's.
            support (Tensor, optional): (K,) its support.
            marginals (Tensor, optional): (K,) its class shares.

        Returns:
            tuple[Tensor, Tensor]: ``boxes`` (N, K, 4) and ``scores``
            (N, K), N the RoIs the RPN kept on this input.
        """
        from mmdet.structures.bbox import bbox2roi
        model, roi_head = self.model, self.model.roi_head
        head = roi_head.bbox_head
        cali = self.cali_vectors(head, prior, support, marginals)
        feats = model.extract_feat(input)
        height, width = self.input_shape
        meta = dict(img_shape=(height, width), scale_factor=(1.0, 1.0))
        proposals = model.rpn_head.predict_by_feat(
            *model.rpn_head(feats), batch_img_metas=[meta], rescale=False)[0]
        rois = bbox2roi([proposals.bboxes])
        extractor = roi_head.bbox_roi_extractor
        roi_feats = extractor(feats[:extractor.num_inputs], rois)
        if roi_head.with_shared_head:
            roi_feats = roi_head.shared_head(roi_feats)
        cls_score, bbox_pred = head(roi_feats) if cali is None else head(
            roi_feats, cali)
        k = head.num_classes
        scores = cls_score.softmax(-1)[:, :k]
        boxes = head.bbox_coder.decode(
            rois[:, 1:], bbox_pred, max_shape=(height, width))
        # -1 along the RoIs: their number is the input's, not the trace's
        if head.reg_class_agnostic:
            return boxes.reshape(-1, 1, 4).expand(-1, k, 4), scores
        return boxes.reshape(-1, k, 4), scores
