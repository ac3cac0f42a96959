# Copyright (c) mmcalidet contributors. All rights reserved.
"""The modules an ONNX export traces: :class:`ExportWrapper` (a
DETR-family detector: one normalised image, and the prior, in; ``dets``
and ``labels`` out) and :class:`DenseExportWrapper` (a one-stage detector:
every location's boxes and scores out, the NMS left to the runtime). A
two-stage detector's is :mod:`~mmcalidet.deploy.two_stage_export`'s; each
head kind's adapter names its own (``export_wrapper``)."""
import math
from typing import List, Optional, Tuple

import torch
from mmdet.structures import DetDataSample
from torch import Tensor, nn

from .traced_forward import TracedForward


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
    """The traced forward of a DETR: one normalised image (and the prior)
    in, ``dets`` and ``labels`` out (arguments: :class:`TracedForward`)."""

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
