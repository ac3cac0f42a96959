# Copyright (c) mmcalidet contributors. All rights reserved.
"""The FCOS family of the dense kind: mmdet's ``FCOSHead`` (and
``CaliFCOSHead``), one 3 x 3 ``conv_cls`` shared by the levels, labels
assigned by the locations' regression ranges and centre regions (no
quality target), and a sigmoid focal loss over the number of positives.

FCOS's ``get_targets`` gives each level's labels of all images one after
the other; :func:`image_major` lays them out per image, the levels one
after the other, as the dense kind keeps locations. A location's cached
box is its point (FCOS's loss decodes none before it assigns; the cached
classification loss reads no box).
"""
import contextlib
from typing import Dict, Iterator, List, Sequence

import torch
from mmdet.utils import reduce_mean
from torch import Tensor, nn

from .dense import DenseFamily, register_dense_family


def image_major(levels: Sequence[Tensor], num_images: int) -> Tensor:
    """Per-level ``(B * N_l, ...)`` tensors, images one after the other
    within a level, as one ``(B, N, ...)`` tensor, the levels one after
    the other within an image."""
    return torch.cat(
        [level.reshape(num_images, -1, *level.shape[1:]) for level in levels],
        1)


def flat_cls_scores(cls_scores: Sequence[Tensor]) -> Tensor:
    """Per-level (B, C, H, W) class scores as (B, N, C)."""
    return torch.cat([
        score.permute(0, 2, 3, 1).reshape(score.shape[0], -1, score.shape[1])
        for score in cls_scores
    ], 1)


def assigned_labels(head: nn.Module, cls_scores: List[Tensor],
                    batch_gt_instances) -> Tensor:
    """The (B, N) labels (background: K) FCOS's loss assigns to every
    location of a batch whose class scores are ``cls_scores``."""
    points = head.prior_generator.grid_priors(
        [score.shape[-2:] for score in cls_scores],
        dtype=cls_scores[0].dtype,
        device=cls_scores[0].device)
    labels = head.get_targets(points, batch_gt_instances)[0]
    return image_major(labels, len(cls_scores[0]))


class FCOSFamily(DenseFamily):
    """FCOS's heads (see the module)."""
    name = 'fcos'
    head_type = 'mmdet.models.dense_heads:FCOSHead'
    cls_conv_name = 'conv_cls'
    score_factors = True

    @contextlib.contextmanager
    def recording(self, head: nn.Module) -> Iterator[Dict[str, Tensor]]:
        """The assignment of ``get_targets`` (see
        :meth:`DenseFamily.recording`): every label, weight and quality
        target 1, each location's point as its box."""
        record: Dict[str, Tensor] = {}
        original = head.get_targets

        def get_targets(points: List[Tensor], batch_gt_instances, *args,
                        **kwargs):
            targets = original(points, batch_gt_instances, *args, **kwargs)
            labels = image_major(targets[0], len(batch_gt_instances))
            ones = torch.ones_like(labels, dtype=points[0].dtype)
            centres = torch.cat(points)
            record.update(
                boxes=torch.cat([centres, centres],
                                -1).expand(len(labels), -1, -1),
                labels=labels,
                weights=ones,
                scores=ones)
            return targets

        head.get_targets = get_targets
        try:
            yield record
        finally:
            del head.get_targets

    def cls_loss(self, head: nn.Module, logits: Tensor, labels: Tensor,
                 scores: Tensor, weights: Tensor) -> Tensor:
        """The focal loss (``loss_cls``) of the locations, weighted, over
        the number of positives (at least 1), as ``FCOSHead.loss_by_feat``
        computes it."""
        positives = ((labels < head.num_classes) & (weights > 0)).sum()
        num_pos = max(reduce_mean(positives.float()), 1.0)
        return head.loss_cls(
            logits.reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            weights.reshape(-1),
            avg_factor=num_pos)


#: FCOS's family
FCOS_FAMILY = register_dense_family(FCOSFamily())
