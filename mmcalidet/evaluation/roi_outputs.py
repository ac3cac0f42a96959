# Copyright (c) mmcalidet contributors. All rights reserved.
"""A two-stage detector's box head run once per image for re-scoring.

Of a two-stage detector's outputs, only the box head's class logits
depend on a prior: a CaliDet head's classifier calibrated by V', or a
plain head's logits under a post-hoc correction. The RPN's proposals, the
RoI features, the shared layers and the box deltas do not.
:class:`RoIHeadOutputs` keeps, per cached image, the classifier's input
(:meth:`~mmcalidet.models.head_kinds.RoIKind.recording_inputs`) and the
box deltas of its proposals' RoIs from one run of the box head;
afterwards a prior costs the classifier (with its calibration or
correction) and the box head's post-processing, which mmdet's
``roi_head.predict`` runs as usual on the kept outputs.
"""
import contextlib
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from mmdet.structures.bbox import bbox2roi
from mmengine.structures import InstanceData
from torch import Tensor, nn

from ..models.head_kinds import ROI
from .roi_correction import corrected_roi_scores


class RoIHeadOutputs:
    """Per image, the box head's classifier inputs and box deltas.

    Args:
        roi_head (nn.Module): a two-stage detector's RoI head (mmdet's
            ``StandardRoIHead`` or a subclass with its ``_bbox_forward``).
    """

    def __init__(self, roi_head: nn.Module) -> None:
        self.roi_head = roi_head
        #: per cache index, (classifier inputs (N, d), box deltas (N, ...))
        self._kept: Dict[int, Optional[Tuple[Tensor, Tensor]]] = {}
        #: the RPN's proposals per cache index (:meth:`predict`)
        self._proposals: Dict[int, InstanceData] = {}

    def _record(self, feats, proposals: List, idx: np.ndarray) -> None:
        """Run the box head once on the batch's proposals and keep each
        image's classifier inputs and box deltas."""
        rois = bbox2roi([p.bboxes for p in proposals])
        if rois.shape[0] == 0:
            self._kept.update((int(k), None) for k in idx)
            return
        with ROI.recording_inputs(self.roi_head.bbox_head) as seen:
            out = self.roi_head._bbox_forward(feats, rois)
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
            score (callable): ``(N, d)`` classifier inputs and ``(N,)``
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

    @classmethod
    def for_model(cls, model: nn.Module) -> 'RoIHeadOutputs':
        """The outputs of a two-stage detector's RoI head."""
        return cls(model.roi_head)

    def predict(self, rescorer, idx: np.ndarray,
                prior: Optional[Tensor]) -> List[InstanceData]:
        """A two-stage detector's detections of a batch, as
        ``TwoStageDetector.predict`` gives them after ``extract_feat``: the
        RPN's proposals and the box head's outputs but its class logits
        (run once per image and kept: the prior reaches neither), then
        the RoI head's post-processing of the class logits under
        ``prior`` (V' of a CaliDet head, a plain one's prior for its
        correction).

        Args:
            rescorer (HeadRescorer): the re-scorer (its model, cache,
                device and correction).
            idx (np.ndarray): the images' cache indices.
            prior (Tensor, optional): see
                :meth:`~.dense_outputs.DenseHeadOutputs.predict`.

        Returns:
            list[InstanceData]: per image ``bboxes``, ``scores``,
            ``labels`` (original image coordinates).
        """
        model = rescorer.model
        feats, samples = rescorer.cache.get(idx, rescorer.device)
        if samples[0].get('proposals', None) is not None:
            proposals = [s.proposals for s in samples]
        else:
            if any(int(k) not in self._proposals for k in idx):
                found = model.rpn_head.predict(feats, samples, rescale=False)
                self._proposals.update(zip(map(int, idx), found))
            proposals = [self._proposals[int(k)] for k in idx]
        head = self.roi_head.bbox_head
        calibrated = contextlib.nullcontext()
        if rescorer.calibratable:
            calibrated = head.calibrated(prior)

            def score(x: Tensor, images: Tensor) -> Tensor:
                return head.cls_score(x, roi_images=images)
        elif rescorer.correction is not None:
            if prior is None:
                raise ValueError('a post-hoc correction needs a prior')

            def score(x: Tensor, images: Tensor) -> Tensor:
                return corrected_roi_scores(
                    ROI.plain_logits(head, x), rescorer.correction, prior,
                    images)
        else:
            if prior is not None:
                raise ValueError(f'{type(model).__name__} takes no prior; '
                                 'pass a post-hoc correction to use one')

            def score(x: Tensor, images: Tensor) -> Tensor:
                return ROI.plain_logits(head, x)

        with calibrated, self.scoring(feats, proposals, idx, score):
            return self.roi_head.predict(
                feats, proposals, samples, rescale=True)
