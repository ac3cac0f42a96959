# Copyright (c) mmcalidet contributors. All rights reserved.
"""The RTMDet family of the dense kind: mmdet's ``RTMDetHead`` (and
``RTMDetSepBNHead``, ``CaliRTMDetHead``), per-level 1 x 1 ``rtm_cls``
convs, the ``DynamicSoftLabelAssigner``'s labels and IoU quality targets,
and a quality focal loss over the sum of the positives' targets
(RTMDet's ``cls_avg_factor``)."""
import contextlib
from typing import Dict, Iterator

import torch
from mmdet.utils import reduce_mean
from torch import Tensor, nn

from .dense import DenseFamily, register_dense_family


class RTMDetFamily(DenseFamily):
    """RTMDet's heads (see the module)."""
    name = 'rtmdet'
    head_type = 'mmdet.models.dense_heads:RTMDetHead'
    cls_conv_name = 'rtm_cls'

    def check(self, head: nn.Module) -> None:
        """Refuse a head with objectness (its scores are not the
        classifier's alone)."""
        if getattr(head, 'with_objectness', False):
            raise TypeError(
                f'{type(head).__name__} scores with objectness: a dense '
                'cache holds RTMDet heads without it')

    @contextlib.contextmanager
    def recording(self, head: nn.Module) -> Iterator[Dict[str, Tensor]]:
        """The assignment of ``get_targets`` (see
        :meth:`DenseFamily.recording`): RTMDet's loss decodes every
        location's box before it assigns."""
        record: Dict[str, Tensor] = {}
        original = head.get_targets

        def get_targets(cls_scores: Tensor, bbox_preds: Tensor, *args,
                        **kwargs):
            targets = original(cls_scores, bbox_preds, *args, **kwargs)
            # (anchors, labels, label weights, box targets, assign metrics)
            labels, weights, _, scores = (
                torch.cat(t, 1) for t in targets[1:5])
            record.update(
                boxes=bbox_preds,
                labels=labels,
                weights=weights,
                scores=scores)
            return targets

        head.get_targets = get_targets
        try:
            yield record
        finally:
            del head.get_targets

    def cls_loss(self, head: nn.Module, logits: Tensor, labels: Tensor,
                 scores: Tensor, weights: Tensor) -> Tensor:
        """The quality focal loss (``loss_cls``), the head's per-level sum
        (average factor 1) over the sum of the positives' quality
        targets."""
        channels = logits.shape[-1]
        avg_factor = reduce_mean(
            scores[labels < head.num_classes].sum()).clamp_(min=1).item()
        return head.loss_cls(
            logits.reshape(-1, channels),
            (labels.reshape(-1), scores.reshape(-1)),
            weights.reshape(-1),
            avg_factor=1.0) / avg_factor


#: RTMDet's family
RTMDET_FAMILY = register_dense_family(RTMDetFamily())
