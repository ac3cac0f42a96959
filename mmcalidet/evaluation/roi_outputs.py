# Copyright (c) mmcalidet contributors. All rights reserved.
"""A two-stage detector's box head run once per image for re-scoring.

Of a two-stage detector's outputs, only the box head's class logits
depend on a prior: a CaliDet head's ``fc_cls`` calibrated by V', or a
plain head's logits under a post-hoc correction. The RPN's proposals, the
RoI features, the shared layers and the box deltas do not.
:class:`RoIHeadOutputs` keeps, per cached image, the input of ``fc_cls``
and the box deltas of its proposals' RoIs from one run of the box head;
afterwards a prior costs ``fc_cls`` (with its calibration or correction)
and the box head's post-processing, which mmdet's ``roi_head.predict``
runs as usual on the kept outputs.
"""
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from mmdet.structures.bbox import bbox2roi
from torch import Tensor, nn


class RoIHeadOutputs:
    """Per image, the box head's ``fc_cls`` inputs and box deltas.

    Args:
        roi_head (nn.Module): a two-stage detector's RoI head (mmdet's
            ``StandardRoIHead`` or a subclass with its ``_bbox_forward``).
    """

    def __init__(self, roi_head: nn.Module) -> None:
        self.roi_head = roi_head
        #: per cache index, (fc_cls inputs (N, d), box deltas (N, ...))
        self._kept: Dict[int, Optional[Tuple[Tensor, Tensor]]] = {}

    def _record(self, feats, proposals: List, idx: np.ndarray) -> None:
        """Run the box head once on the batch's proposals and keep each
        image's ``fc_cls`` inputs and box deltas."""
        rois = bbox2roi([p.bboxes for p in proposals])
        if rois.shape[0] == 0:
            self._kept.update((int(k), None) for k in idx)
            return
        seen: List[Tensor] = []
        fc_cls = self.roi_head.bbox_head.fc_cls
        handle = fc_cls.register_forward_pre_hook(
            lambda module, args: seen.append(args[0]))
        try:
            out = self.roi_head._bbox_forward(feats, rois)
        finally:
            handle.remove()
        counts = [len(p) for p in proposals]
        for k, x, deltas in zip(idx, seen[0].split(counts),
                                out['bbox_pred'].split(counts)):
            self._kept[int(k)] = (x, deltas)

    @contextmanager
    def scoring(self, feats, proposals: List, idx: np.ndarray,
                score: Callable[[Tensor, Tensor], Tensor]) -> Iterator[None]:
        """Inside the block, the RoI head's box forward on the batch's
        proposals gives the kept box deltas and ``score(cls_features,
        roi_images)`` as its class logits (the box head runs first for a
        batch with an image not kept).

        Args:
            feats (tuple[Tensor]): the batch's neck features.
            proposals (list[InstanceData]): its proposals, per image.
            idx (np.ndarray): its cache indices.
            score (callable): ``(N, d)`` ``fc_cls`` inputs and ``(N,)``
                RoI image indices to ``(N, K + 1)`` logits.

        Yields:
            None: the RoI head re-scoring the kept outputs.
        """
        if any(int(k) not in self._kept for k in idx):
            self._record(feats, proposals, idx)
        kept = [self._kept[int(k)] for k in idx]
        kept = [item for item in kept if item is not None]
        cls_features = torch.cat([x for x, _ in kept]) if kept else None
        deltas = torch.cat([d for _, d in kept]) if kept else None

        def kept_forward(x, rois: Tensor) -> dict:
            if cls_features is None or rois.shape[0] != len(cls_features):
                raise RuntimeError('the RoIs are not the kept proposals\'')
            return dict(
                cls_score=score(cls_features, rois[:, 0]),
                bbox_pred=deltas,
                bbox_feats=None)

        self.roi_head._bbox_forward = kept_forward
        try:
            yield
        finally:
            del self.roi_head._bbox_forward
