# Copyright (c) mmcalidet contributors. All rights reserved.
"""Logit Manipulation (LoMa) loss (paper Sec. 3.2)."""
from typing import Optional

import torch
from mmdet.models.losses.utils import weight_reduce_loss
from mmdet.registry import MODELS
from torch import Tensor, nn

from ..layers import prior_delta


def loma_class_weights(prior: Tensor, sample_prior: Tensor) -> Tensor:
    r"""Per-class LoMa factor
    :math:`w_j = \frac{1}{K}\sum_i -\mathrm{sign}(E_x - E_0)_{ij}
    (E - E_0)_{ij}`.

    ``w_j < 0`` (the logit of class ``j`` is pushed up) where the injected
    prior agrees with the image's statistics in column ``j``, ``w_j > 0``
    where it disagrees; a class absent from the image has a flat column in
    ``E_x`` and gets ``w_j = 0``.

    Args:
        prior (Tensor): the injected priors E, (B, K, K) or (K, K).
        sample_prior (Tensor): the images' statistics E_x, (B, K, K).

    Returns:
        Tensor: (B, K).
    """
    agree = torch.sign(prior_delta(sample_prior)) * prior_delta(prior)
    return -agree.mean(dim=-2)


@MODELS.register_module()
class LoMaLoss(nn.Module):
    r"""Logit Manipulation loss.

    For pre-sigmoid logits :math:`s` (B x Q x K):
    :math:`L = \gamma \cdot \mathrm{mean}_{b, q} \frac{1}{K}\sum_j s_{bqj}
    w_{bj}` with :math:`w` from :func:`loma_class_weights`. The loss is
    linear in the logits: it reshapes the loss landscape so that an accurate
    prior yields higher logits for the classes present in the image and a
    misleading one lower logits.

    Args:
        loss_weight (float): gamma. Defaults to 20.0 (the paper's value).
        reduction (str): ``'mean'`` (over images and queries), ``'sum'`` or
            ``'none'`` (B x Q). Defaults to ``'mean'``.
    """

    def __init__(self,
                 loss_weight: float = 20.0,
                 reduction: str = 'mean') -> None:
        super().__init__()
        if reduction not in ('none', 'mean', 'sum'):
            raise ValueError(f'reduction must be none, mean or sum, got '
                             f'{reduction!r}')
        self.loss_weight = loss_weight
        self.reduction = reduction

    def forward(self,
                cls_scores: Tensor,
                prior: Tensor,
                sample_prior: Tensor,
                weight: Optional[Tensor] = None,
                avg_factor: Optional[float] = None,
                reduction_override: Optional[str] = None,
                class_mask: Optional[Tensor] = None) -> Tensor:
        """Compute the loss.

        Args:
            cls_scores (Tensor): pre-sigmoid logits (B, Q, K); extra
                trailing channels (e.g. a background logit) are ignored.
            prior (Tensor): injected priors E, (B, K, K) or (K, K).
            sample_prior (Tensor): per-image statistics E_x, (B, K, K).
            weight (Tensor, optional): per-query weights (B, Q), e.g. 1 for
                the queries to average over and 0 for the others.
            avg_factor (float, optional): divide the sum by this instead of
                averaging (with ``reduction='mean'``).
            reduction_override (str, optional): overrides ``reduction``.
            class_mask (Tensor, optional): (B, Q, K) factors of each logit
                (e.g. the one-hot matched class); the sum over classes is
                still divided by K.

        Returns:
            Tensor: the loss (a scalar unless the reduction is ``'none'``).
        """
        reduction = reduction_override or self.reduction
        num_classes = sample_prior.shape[-1]
        if cls_scores.shape[-1] < num_classes or cls_scores.dim() != 3:
            raise ValueError(f'cls_scores must be (B, Q, >=K) with '
                             f'K={num_classes}, got {tuple(cls_scores.shape)}')
        class_weights = loma_class_weights(prior, sample_prior)
        if class_weights.dim() == 1:
            class_weights = class_weights.unsqueeze(0)
        # (B, 1, K): one weight per image and class, shared by its queries
        class_weights = class_weights.to(cls_scores.dtype).unsqueeze(1)
        terms = cls_scores[..., :num_classes] * class_weights
        if class_mask is not None:
            if class_mask.shape != terms.shape:
                raise ValueError(f'class_mask must be {tuple(terms.shape)}, '
                                 f'got {tuple(class_mask.shape)}')
            terms = terms * class_mask.to(terms.dtype)
        loss = terms.mean(dim=-1)
        loss = weight_reduce_loss(
            loss, weight=weight, reduction=reduction, avg_factor=avg_factor)
        return self.loss_weight * loss
