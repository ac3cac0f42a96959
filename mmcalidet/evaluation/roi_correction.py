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
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import Tensor, nn


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


@contextmanager
def corrected_roi_scores(roi_head: nn.Module, correction: Callable,
                         priors: Tensor) -> Iterator[None]:
    """Within the block, ``roi_head``'s box head scores every RoI with its
    foreground logits shifted by ``correction.softmax_shift`` of its
    image's prior.

    Args:
        roi_head (nn.Module): a plain ``StandardRoIHead`` (or one with its
            ``_bbox_forward``).
        correction (callable): a correction with ``softmax_shift``
            (:func:`check_softmax_correction`).
        priors (Tensor): (K, K) for every image, or (B, K, K) for the B
            images of the batch the head scores.

    Yields:
        None: the head corrected until the block ends.
    """
    shift = correction.softmax_shift(priors)
    forward = roi_head._bbox_forward

    def shifted(x, rois: Tensor) -> dict:
        results = forward(x, rois)
        cls_score = results['cls_score']
        per_roi = shift if shift.dim() == 1 else shift[rois[:, 0].long()]
        k = per_roi.shape[-1]
        results['cls_score'] = torch.cat(
            [cls_score[:, :k] + per_roi.to(cls_score), cls_score[:, k:]],
            dim=1)
        return results

    roi_head._bbox_forward = shifted
    try:
        yield
    finally:
        del roi_head._bbox_forward
