# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a one-stage head's cache records: the classification features
and the assigner's targets of one loss call (:func:`recording`, from the
dense head kind's adapter), and the locations kept per image
(:func:`select_locations`); :mod:`.dense` makes the cache."""
import contextlib
from typing import Dict, Iterator, List, Tuple

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def recording(
        head: nn.Module) -> Iterator[Tuple[List[Tuple[Tensor, Tensor]], Dict]]:
    """Record, inside the block, the calls of the head's classification
    conv(s) (``(input, output)``, one per level) and the assignment of its
    loss (``labels``, ``weights``, ``scores``, ``boxes``: see
    :meth:`~mmcalidet.models.head_kinds.DenseFamily.recording`).

    Args:
        head (nn.Module): a one-stage head the dense cache can hold
            (:meth:`~mmcalidet.models.head_kinds.DenseKind.
            check_cacheable`).

    Yields:
        tuple[list[tuple[Tensor, Tensor]], dict]: the calls and the
        assignment record.

    Raises:
        TypeError: a head the dense cache cannot hold.
    """
    from ..models.head_kinds.dense import DENSE
    DENSE.check_cacheable(head)
    with DENSE.recording_calls(head) as calls, \
            DENSE.family(head).recording(head) as record:
        yield calls, record


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
