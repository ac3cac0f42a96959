# Copyright (c) mmcalidet contributors. All rights reserved.
"""A post-hoc prior correction of a plain two-stage detector's RoI head.

The RoI head scores K classes and background with a softmax. The marginal
re-weighting (:class:`~mmcalidet.evaluation.baselines.PriorReweighting`)
acts on it in Saerens et al.'s own form: each foreground logit plus
``log(pi_target / pi_source)`` of its class, the background's kept. The
shift is added to the class logits of every RoI the head scores, each
RoI under its own image's prior (a RoI's first column is its image's
index in the batch). Corrections defined on sigmoid logits only (the
co-occurrence rescoring) are refused by name.
"""
from typing import Callable

import torch
from torch import Tensor


def check_softmax_correction(correction: Callable, detector: str) -> None:
    """Refuse a correction with no softmax form.

    Args:
        correction (callable): the post-hoc correction.
        detector (str): the detector's name, for the message.

    Raises:
        ValueError: the correction has no ``softmax_shift``.
    """
    if not callable(getattr(correction, 'softmax_shift', None)):
        raise ValueError(
            f'{type(correction).__name__} acts on sigmoid class logits '
            f'only; {detector}\'s RoI head scores with a softmax, which '
            'the marginal re-weighting (PriorReweighting, --posthoc '
            'reweight) corrects')


def corrected_roi_scores(cls_score: Tensor, correction: Callable,
                         priors: Tensor, roi_images: Tensor) -> Tensor:
    """A RoI head's class logits with each RoI's foreground logits
    shifted by ``correction.softmax_shift`` of its image's prior.

    Args:
        cls_score (Tensor): (N, K + 1) logits, background last.
        correction (callable): a correction with ``softmax_shift``
            (:func:`check_softmax_correction`).
        priors (Tensor): (K, K) for every image, or (B, K, K) for the B
            images of the batch.
        roi_images (Tensor): (N,) the image index of every RoI
            (``rois[:, 0]``).

    Returns:
        Tensor: (N, K + 1) the corrected logits.
    """
    shift = correction.softmax_shift(priors)
    per_roi = shift if shift.dim() == 1 else shift[roi_images.long()]
    k = per_roi.shape[-1]
    return torch.cat(
        [cls_score[:, :k] + per_roi.to(cls_score), cls_score[:, k:]], dim=1)
