# Copyright (c) mmcalidet contributors. All rights reserved.
"""Dense-head caches: what a one-stage head's classification loss needs.

A one-stage head (RTMDet's, FCOS's, or their calibrated twins) classifies
every location of every level with a conv, ``W_l^T h + b_l`` over the
location's neighbourhood; only that conv depends on the prior. Its loss
is a classification loss over the locations the assigner labels
(positives: a class, and for RTMDet a soft IoU target; negatives:
background) and LoMa on the positives' assigned class; the head family's
(:class:`~mmcalidet.models.head_kinds.DenseFamily`).

Per image the cache keeps, as the Q "queries" of one layer of the one
cache format (:mod:`.store`), the classification features ``h`` (the
input of the level's classification conv over its kernel,
:meth:`~mmcalidet.models.head_kinds.DenseKind.feature_width` wide) at
every positive location and at a seeded random sample of the negative
ones, padded to a fixed Q, and in ``targets.npy`` each location's level,
label, quality target and weight: the head's label weight, times
``negatives / sampled negatives`` for a sampled negative (so the loss sum
stays unbiased), 0 for padding. With enough locations (``num_locations``
>= the map's) nothing is sampled and the cached loss is the head's.

The assignment is the frozen detector's, made once: a CaliDet one's under
its deployment prior (a plain detector's, the usual baseline, has none).
"""
import contextlib
from typing import Iterable, Optional

import torch
from torch import nn

from ..utils.validation import check_int
from .dense_targets import recording, select_locations
from .samples import normalised_cxcywh
from .store import DecoderCache
from .writer import DecoderCacheWriter, fill_targets_cache

#: cached locations per image when a source names none
DEFAULT_NUM_LOCATIONS = 1024


def is_dense_model(model: nn.Module) -> bool:
    """Whether ``model`` is a one-stage detector whose head a dense cache
    holds (RTMDet, FCOS and their CaliDet twins)."""
    from ..models.head_kinds import DENSE, find_head_kind
    if find_head_kind(model) is not DENSE:
        return False
    try:
        DENSE.check_cacheable(model.bbox_head)
    except TypeError:
        return False
    return True


def _head_loss_records(model: nn.Module, batch: dict) -> tuple:
    """Preprocess a batch (test mode), run the head's loss and return the
    data samples, the per-level classification features (each location's
    over its conv's kernel, (B, N_l, d * k * k)) and the assignment."""
    from ..models.head_kinds.dense import DENSE, location_features
    data = model.data_preprocessor(batch, False)
    samples = data['data_samples']
    feats = model.extract_feat(data['inputs'])
    head = model.bbox_head
    calibration = model.head_calibration(feats[0], samples) if hasattr(
        model, 'head_calibration') else contextlib.nullcontext()
    with calibration, recording(head) as (calls, record):
        head.loss(feats, samples)
    if len(calls) != head.prior_generator.num_levels or \
            record.get('labels') is None:
        raise RuntimeError(
            f'{type(head).__name__}.loss made {len(calls)} classification '
            'calls and no usable assignment: not a head of its family')
    levels = [
        location_features(conv, x)
        for conv, (x, _) in zip(DENSE.level_convs(head), calls)
    ]
    return samples, levels, record


def run_dense_head(model: nn.Module, batch: dict, num_locations: int,
                   generator: torch.Generator) -> tuple:
    """Run a one-stage detector's head loss on a batch and keep, per
    image, the classification features and targets of its positive and
    a sample of its negative locations (see the module).

    Args:
        model (nn.Module): a one-stage detector (eval mode) whose head a
            dense cache holds (:func:`is_dense_model`).
        batch (dict): ``dict(inputs=[...], data_samples=[...])``.
        num_locations (int): Q, the cached locations per image.
        generator (torch.Generator): draws the negatives.

    Returns:
        tuple: the data samples, the features (1, B, Q, d * k * k), the
        boxes
        (1, B, Q, 4) (normalised cxcywh) and the targets (B, Q, 4):
        level, label, quality score, weight.
    """
    samples, levels, record = _head_loss_records(model, batch)
    num_classes = model.bbox_head.num_classes
    b = levels[0].shape[0]
    feats = torch.cat(levels, 1)
    level_of = torch.cat([
        feats.new_full((f.shape[1], ), float(k)) for k, f in enumerate(levels)
    ])
    labels, weights, scores = (
        record[key] for key in ('labels', 'weights', 'scores'))
    boxes = torch.stack([
        normalised_cxcywh(bboxes, sample.metainfo['img_shape'])
        for bboxes, sample in zip(record['boxes'], samples)
    ])
    hidden, kept_boxes, targets = [], [], []
    for i in range(b):
        index, weight = select_locations(labels[i], weights[i].float(),
                                         num_classes, num_locations, generator)
        kept = weight > 0
        hidden.append(feats[i, index] * kept[:, None])
        kept_boxes.append(boxes[i, index] * kept[:, None])
        targets.append(
            torch.stack([
                level_of[index] * kept,
                torch.where(kept, labels[i, index], num_classes).to(
                    weight.dtype), scores[i, index].to(weight.dtype) * kept,
                weight
            ], -1))
    return (samples, torch.stack(hidden)[None], torch.stack(kept_boxes)[None],
            torch.stack(targets))


def fill_dense_cache(model: nn.Module,
                     data: Iterable[dict],
                     writer: DecoderCacheWriter,
                     num_locations: Optional[int] = None,
                     seed: Optional[int] = None,
                     progress: bool = True,
                     total: Optional[int] = None,
                     desc: str = 'dense cache') -> DecoderCache:
    """Run a one-stage detector (eval mode, no gradients) over batches into
    a writer and commit it (a failure removes what was written).

    Args:
        model (nn.Module): a one-stage detector (:func:`is_dense_model`).
        data (Iterable[dict]): batches as a data loader yields them.
        writer (DecoderCacheWriter): where the locations go.
        num_locations (int, optional): Q; defaults to
            :data:`DEFAULT_NUM_LOCATIONS`.
        seed (int, optional): seed of the negatives' draw (0 without).
        progress (bool): show a progress bar.
        total (int, optional): images, for the progress bar.
        desc (str): the progress bar's label.

    Returns:
        DecoderCache: the cache (``head='dense'``).
    """
    num_locations = check_int(
        'num_locations', DEFAULT_NUM_LOCATIONS
        if num_locations is None else num_locations, 1)
    generator = torch.Generator().manual_seed(
        check_int('seed', 0 if seed is None else seed, 0))
    model.eval()
    head = model.bbox_head
    writer.info.update(
        num_levels=int(head.prior_generator.num_levels),
        num_classes=int(head.num_classes),
        num_locations=num_locations)
    return fill_targets_cache(
        lambda batch: run_dense_head(model, batch, num_locations, generator),
        data, writer, 'dense', progress, total, desc)
