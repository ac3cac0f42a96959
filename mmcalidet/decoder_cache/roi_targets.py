# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a box head's cache records: the classification features (the
input of ``fc_cls``) and the targets of the RoIs one ``loss`` call
sampled (:func:`recording_rois`), and each image's rows padded to a fixed
number (:func:`pad_rois`); :mod:`.roi` makes the cache."""
import contextlib
from typing import Dict, Iterator

import torch
from torch import Tensor, nn


def roi_cls_layer(head: nn.Module) -> nn.Linear:
    """The linear classifier of a two-stage box head.

    Args:
        head (nn.Module): a ``BBoxHead`` (``Shared2FCBBoxHead``) or its
            calibrated twin.

    Returns:
        nn.Linear: ``fc_cls``, K + 1 softmax outputs.

    Raises:
        TypeError: the head has no such classifier (no ``fc_cls``, a
            sigmoid or a custom classification loss).
    """
    fc = getattr(head, 'fc_cls', None)
    num_classes = getattr(head, 'num_classes', None)
    if not isinstance(fc, nn.Linear) or not hasattr(head, 'loss_and_target') \
            or getattr(head, 'custom_cls_channels', False) or \
            fc.out_features != (num_classes or 0) + 1:
        raise TypeError(
            f'{type(head).__name__} is not a box head whose linear K + 1 '
            'softmax classifier (fc_cls) a RoI cache can hold')
    return fc


@contextlib.contextmanager
def recording_rois(head: nn.Module) -> Iterator[Dict[str, Tensor]]:
    """Record, inside the block, what the box head's ``loss_and_target``
    sees: the RoIs (``rois``, (N, 5), image index first), the input of its
    last ``fc_cls`` call (``feats``, (N, d)), the logits (``cls_score``,
    (N, K + 1)), and the targets' labels and label weights (``labels``,
    ``label_weights``, (N,)).

    Args:
        head (nn.Module): a box head (:func:`roi_cls_layer`).

    Yields:
        dict[str, Tensor]: the record, filled by the loss call.
    """
    record: Dict[str, Tensor] = {}
    last: Dict[str, Tensor] = {}
    hook = roi_cls_layer(head).register_forward_pre_hook(
        lambda m, args: last.update(feats=args[0]))
    original = head.loss_and_target

    def loss_and_target(cls_score: Tensor, bbox_pred: Tensor, rois: Tensor,
                        *args, **kwargs) -> dict:
        out = original(cls_score, bbox_pred, rois, *args, **kwargs)
        labels, label_weights = out['bbox_targets'][:2]
        if isinstance(labels, (list, tuple)):  # concat=False
            labels, label_weights = torch.cat(labels), torch.cat(label_weights)
        feats = last.get('feats')
        if feats is None or len(feats) != len(rois):
            raise RuntimeError(
                f'{type(head).__name__}: the last fc_cls call did not '
                'classify the RoIs of the loss')
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
        hook.remove()


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
