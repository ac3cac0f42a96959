# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a one-stage head's cache records: the classification features
and the assigner's targets of one loss call (:func:`recording`), and the
locations kept per image (:func:`select_locations`); :mod:`.dense` makes
the cache."""
import contextlib
from typing import Dict, Iterator, List, Tuple

import torch
from torch import Tensor, nn


def dense_cls_convs(head: nn.Module) -> List[nn.Conv2d]:
    """The per-level classification convs of a one-stage head.

    Args:
        head (nn.Module): ``RTMDetSepBNHead`` or a calibrated twin.

    Returns:
        list[nn.Conv2d]: one conv per level.

    Raises:
        TypeError: the head's classifier cannot be cached per location.
    """
    name = getattr(head, 'cls_conv_name', 'rtm_cls')
    convs = getattr(head, name, None)
    if isinstance(convs, nn.Conv2d):
        convs = [convs] * head.prior_generator.num_levels
    if convs is None or not hasattr(head, 'get_targets') or \
            getattr(head, 'with_objectness', False):
        raise TypeError(
            f'{type(head).__name__} is not a one-stage head whose '
            'per-level classification conv the cache can hold (RTMDet '
            'without objectness)')
    for conv in convs:
        if tuple(conv.kernel_size) != (1, 1) or \
                conv.out_channels != head.cls_out_channels:
            raise TypeError(
                'a dense cache holds one feature per location: the '
                'classification convs must be 1 x 1 with one base prior, '
                f'got {conv}')
    return list(convs)


@contextlib.contextmanager
def recording(head: nn.Module) -> Iterator[Tuple[List[Tensor], Dict]]:
    """Record, inside the block, the inputs of the head's classification
    convs (one (B, d, H, W) per level) and what its ``get_targets`` takes
    and gives (``bboxes``: the decoded boxes, ``targets``: the assigner's
    targets per level).

    Args:
        head (nn.Module): a one-stage head (:func:`dense_cls_convs`).

    Yields:
        tuple[list[Tensor], dict]: the features and the targets record.
    """
    feats: List[Tensor] = []
    record: Dict = {}
    hooks = [
        conv.register_forward_pre_hook(lambda m, args: feats.append(args[0]))
        for conv in dense_cls_convs(head)
    ]
    original = head.get_targets

    def get_targets(cls_scores: Tensor, bbox_preds: Tensor, *args, **kwargs):
        targets = original(cls_scores, bbox_preds, *args, **kwargs)
        record.update(bboxes=bbox_preds, targets=targets)
        return targets

    head.get_targets = get_targets
    try:
        yield feats, record
    finally:
        del head.get_targets
        for hook in hooks:
            hook.remove()


def select_locations(labels: Tensor, weights: Tensor, num_classes: int,
                     num_locations: int,
                     generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """The cached locations of an image: every positive, then negatives
    (a random sample when they do not fit), padded to ``num_locations``.

    Args:
        labels (Tensor): (N,) assigned labels (background: K).
        weights (Tensor): (N,) the head's label weights (0: ignored).
        num_classes (int): K.
        num_locations (int): Q.
        generator (torch.Generator): draws the negatives.

    Returns:
        tuple[Tensor, Tensor]: (Q,) location indices and (Q,) loss weights
        (0 for padding, scaled up for sampled negatives).

    Raises:
        ValueError: the positives leave no room for a negative.
    """
    used = weights > 0
    pos = torch.nonzero(used & (labels < num_classes)).squeeze(1)
    neg = torch.nonzero(used & (labels == num_classes)).squeeze(1)
    room = num_locations - len(pos)
    if room < min(len(neg), 1):
        raise ValueError(
            f'an image has {len(pos)} positive locations: '
            f'num_locations={num_locations} leaves no room for a negative; '
            'cache more locations')
    scale = 1.0
    if len(neg) > room:
        pick = torch.randperm(len(neg), generator=generator)[:room]
        neg, scale = neg[pick.sort().values.to(neg.device)], len(neg) / room
    index = torch.cat([pos, neg])
    weight = torch.cat([weights[pos], weights[neg] * scale])
    pad = num_locations - len(index)
    return (torch.cat([index, index.new_zeros(pad)]),
            torch.cat([weight, weight.new_zeros(pad)]))
