# Copyright (c) mmcalidet contributors. All rights reserved.
"""The calibrator's losses on a two-stage box head's cached RoIs.

A box-head cache (:mod:`mmcalidet.decoder_cache.roi`) holds, per image,
the input of ``fc_cls`` of the RoIs the training sampler drew, with their
label (K: background) and label weight, padded with weight 0. The losses
are the box head's on images for those RoIs: the calibrated logits
``(W + rho V') h + b`` (the background logit plain), the head's
``loss_cls`` (cross-entropy) over mmdet's ``BBoxHead.loss`` average
factor (the batch's RoIs of positive label weight, at least 1), its
accuracy, and LoMa on the positive RoIs' target class.
"""
from typing import Dict

import torch
import torch.nn.functional as F
from mmdet.models.losses import accuracy
from mmdet.structures import SampleList
from torch import Tensor, nn

from ..layers.calibration_term import add_calibration


def calibrated_roi_logits(head: nn.Module,
                          hidden: Tensor,
                          cali_vectors: Tensor,
                          train_fc_cls: bool = False) -> Tensor:
    """``(W + rho V') h + b`` of cached RoIs: the K class logits
    calibrated, the background logit plain (the head's ``fc_cls``).

    Args:
        head (nn.Module): a calibrated box head
            (:class:`~mmcalidet.models.roi_heads.CalibratedBBoxClsMixin`).
        hidden (Tensor): (B, Q, d) cached features.
        cali_vectors (Tensor): V', (K, d) or (B, K, d).
        train_fc_cls (bool): let gradients reach ``W`` and ``b``.

    Returns:
        Tensor: (B, Q, K + 1) logits.
    """
    fc = head.fc_cls
    with torch.set_grad_enabled(train_fc_cls and torch.is_grad_enabled()):
        logits = F.linear(hidden, fc.weight, fc.bias)
    deltas = fc.output_deltas(cali_vectors.to(hidden.dtype))
    return add_calibration(logits, hidden, deltas, head.rho)


def cached_roi_head_losses(head: nn.Module,
                           hidden_states: Tensor,
                           targets: Tensor,
                           batch_data_samples: SampleList,
                           cali_vectors: Tensor,
                           priors: Tensor,
                           train_fc_cls: bool = False) -> Dict[str, Tensor]:
    """The classification losses of a calibrated box head on cached RoIs
    (see the module).

    Args:
        head (nn.Module): a calibrated box head (``CaliShared2FCBBoxHead``).
        hidden_states (Tensor): (1, B, Q, d) cached features.
        targets (Tensor): (B, Q, 4) level (0), label (K: background),
            positive and label weight of each RoI (padding: weight 0).
        batch_data_samples (list[DetDataSample]): with ``gt_instances``
            (and ``sample_prior`` from the EdgeSampler).
        cali_vectors (Tensor): V' of ``priors``, (B, K, d) or (K, d).
        priors (Tensor): the injected priors, (B, K, K) or (K, K).
        train_fc_cls (bool): let gradients reach ``fc_cls`` (otherwise only
            the CaliFormer learns).

    Returns:
        dict[str, Tensor]: ``loss_cls``, ``acc`` and, with LoMa,
        ``loss_loma``.
    """
    hidden = hidden_states[-1]
    _, labels, _, weights = targets.unbind(-1)
    logits = calibrated_roi_logits(head, hidden, cali_vectors, train_fc_cls)
    k = head.num_classes
    labels = torch.where(weights > 0, labels.long(), k)
    used = weights > 0
    # BBoxHead.loss: the batch's RoIs of positive label weight, at least 1
    avg_factor = max(float(used.sum()), 1.0)
    flat = logits.reshape(-1, logits.shape[-1])
    losses = dict(
        loss_cls=head.loss_cls(
            flat,
            labels.reshape(-1),
            weights.reshape(-1),
            avg_factor=avg_factor),
        acc=accuracy(logits[used], labels[used]))
    if head.loss_loma is not None:
        losses['loss_loma'] = head.matched_class_loma(
            head.loma_inputs(logits), labels, priors,
            head.get_sample_priors(batch_data_samples, logits))
    return losses
