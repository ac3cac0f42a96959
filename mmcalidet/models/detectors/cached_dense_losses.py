# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibrator's losses on a one-stage head's cached locations.

A dense cache (:mod:`mmcalidet.decoder_cache.dense`) holds, per image, the
classification features of the assigner's positive and of sampled
negative locations with their level, label, quality target and weight.
The losses are the head's on images restricted to those locations: the
calibrated logits ``(W_l + rho V')^T h + b_l`` of each location's level,
the head's quality focal loss (its ``loss_cls``) divided by the sum of
the positives' quality targets (RTMDet's ``cls_avg_factor``), and LoMa on
the positives' assigned class.
"""
from typing import Dict, List

import torch
import torch.nn.functional as F
from mmdet.structures import SampleList
from mmdet.utils import reduce_mean
from torch import Tensor, nn

from ..layers.calibration_term import add_calibration


def cached_level_logits(convs: List[nn.Conv2d], hidden: Tensor,
                        levels: Tensor) -> Tensor:
    """The plain logits ``W_l^T h + b_l`` of cached locations, each by the
    1 x 1 classification conv of its level.

    Args:
        convs (list[nn.Conv2d]): the head's per-level convs.
        hidden (Tensor): (B, Q, d) cached features.
        levels (Tensor): (B, Q) their levels (integers).

    Returns:
        Tensor: (B, Q, C) logits.
    """
    levels = levels.long()
    logits = hidden.new_zeros((*hidden.shape[:2], convs[0].out_channels))
    for k, conv in enumerate(convs):
        mask = levels == k
        out = F.linear(hidden[mask], conv.weight.flatten(1), conv.bias)
        logits = logits.index_put((mask, ), out)
    return logits


def calibrated_location_logits(head: nn.Module,
                               hidden: Tensor,
                               levels: Tensor,
                               cali_vectors: Tensor,
                               train_cls_convs: bool = False) -> Tensor:
    """``(W_l + rho V')^T h + b_l`` at cached locations.

    Args:
        head (nn.Module): a calibrated dense head
            (:class:`~mmcalidet.models.dense_heads.CalibratedDenseClsMixin`).
        hidden (Tensor): (B, Q, d) cached features.
        levels (Tensor): (B, Q) their levels.
        cali_vectors (Tensor): V', (K, d) or (B, K, d).
        train_cls_convs (bool): let gradients reach ``W_l`` and ``b_l``.

    Returns:
        Tensor: (B, Q, C) logits.
    """
    convs = list(head.dense_cls_convs().values())
    with torch.set_grad_enabled(train_cls_convs and torch.is_grad_enabled()):
        logits = cached_level_logits(convs, hidden, levels)
    deltas = convs[0].channel_deltas(cali_vectors.to(hidden.dtype))
    return add_calibration(logits, hidden, deltas, head.rho)


def cached_dense_head_losses(
        head: nn.Module,
        hidden_states: Tensor,
        targets: Tensor,
        batch_data_samples: SampleList,
        cali_vectors: Tensor,
        priors: Tensor,
        train_cls_convs: bool = False) -> Dict[str, Tensor]:
    """The training losses of a calibrated dense head on cached locations
    (see the module).

    Args:
        head (nn.Module): a calibrated dense head (``CaliRTMDetHead``).
        hidden_states (Tensor): (1, B, Q, d) cached features.
        targets (Tensor): (B, Q, 4) level, label (K: background), quality
            target and weight of each location.
        batch_data_samples (list[DetDataSample]): with ``gt_instances``
            (and ``sample_prior`` from the EdgeSampler).
        cali_vectors (Tensor): V' of ``priors``, (B, K, d) or (K, d).
        priors (Tensor): the injected priors, (B, K, K) or (K, K).
        train_cls_convs (bool): let gradients reach the classification
            convs (otherwise only the CaliFormer learns).

    Returns:
        dict[str, Tensor]: ``loss_cls`` and, with LoMa, ``loss_loma``.
    """
    hidden = hidden_states[-1]
    levels, labels, scores, weights = targets.unbind(-1)
    logits = calibrated_location_logits(head, hidden, levels, cali_vectors,
                                        train_cls_convs)
    k = head.num_classes
    labels = torch.where(weights > 0, labels.long(), k)
    channels = logits.shape[-1]
    avg_factor = reduce_mean(scores[labels < k].sum()).clamp_(min=1).item()
    # the head's per-level sum (avg_factor 1), over its cls_avg_factor
    loss_cls = head.loss_cls(
        logits.reshape(-1, channels), (labels.reshape(-1), scores.reshape(-1)),
        weights.reshape(-1),
        avg_factor=1.0) / avg_factor
    losses = dict(loss_cls=loss_cls)
    if head.loss_loma is not None:
        losses['loss_loma'] = head.matched_class_loma(
            logits, labels, priors,
            head.get_sample_priors(batch_data_samples, logits))
    return losses
