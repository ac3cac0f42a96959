# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a box head's cache records: the classification features (the
input of its classifier, :meth:`~mmcalidet.models.head_kinds.RoIKind.
cls_layer`) and the targets of the RoIs one ``loss`` call sampled
(:func:`recording_rois`), and each image's rows padded to a fixed number
(:func:`pad_rois`); :mod:`.roi` makes the cache."""
import contextlib
from typing import Dict, Iterator

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def recording_rois(head: nn.Module) -> Iterator[Dict[str, Tensor]]:
    """Record, inside the block, what the box head's ``loss_and_target``
    sees: the RoIs (``rois``, (N, 5), image index first), the input of its
    classifier's last call (``feats``, (N, d)), the logits (``cls_score``,
    (N, K + 1)), and the targets' labels and label weights (``labels``,
    ``label_weights``, (N,)).

    Args:
        head (nn.Module): a box head with a linear softmax classifier
            (:meth:`~mmcalidet.models.head_kinds.RoIKind.cls_layer`).

    Yields:
        dict[str, Tensor]: the record, filled by the loss call.
    """
    from ..models.head_kinds.roi import ROI
    record: Dict[str, Tensor] = {}
    original = head.loss_and_target
    with ROI.recording_inputs(head) as inputs:

        def loss_and_target(cls_score: Tensor, bbox_pred: Tensor, rois: Tensor,
                            *args, **kwargs) -> dict:
            out = original(cls_score, bbox_pred, rois, *args, **kwargs)
            labels, label_weights = out['bbox_targets'][:2]
            if isinstance(labels, (list, tuple)):  # concat=False
                labels = torch.cat(labels)
                label_weights = torch.cat(label_weights)
            feats = inputs[-1] if inputs else None
            if feats is None or len(feats) != len(rois):
                raise RuntimeError(
                    f'{type(head).__name__}: the classifier\'s last call '
                    'did not classify the RoIs of the loss')
            record.update(
                rois=rois,
                feats=feats,
                cls_score=cls_score,
                labels=labels,
                label_weights=label_weights)
            return out

        head.loss_and_target = loss_and_target
        try:
            yield record
        finally:
            del head.loss_and_target


def pad_rois(values: Tensor,
             images: Tensor,
             image: int,
             num_rois: int,
             fill: float = 0.0) -> Tensor:
    """The rows of one image's RoIs, in their order, padded to
    ``num_rois``.

    Args:
        values (Tensor): (N, ...) one row per RoI of the batch.
        images (Tensor): (N,) each RoI's image index.
        image (int): the image.
        num_rois (int): Q.
        fill (float): the padding rows' value.

    Returns:
        Tensor: (Q, ...).

    Raises:
        ValueError: the image has more than ``num_rois`` RoIs.
    """
    rows = values[images.long() == image]
    if len(rows) > num_rois:
        raise ValueError(
            f'an image has {len(rows)} sampled RoIs: num_locations='
            f'{num_rois} cannot hold them; cache at least the sampler\'s '
            'num RoIs per image')
    pad = rows.new_full((num_rois - len(rows), *rows.shape[1:]), fill)
    return torch.cat([rows, pad])
