# Copyright (c) mmcalidet contributors. All rights reserved.
"""Dense-head caches: what a one-stage head's classification loss needs.

A one-stage head (RTMDet's ``RTMDetSepBNHead``, or its calibrated
``CaliRTMDetHead``) classifies every location of every level with a 1 x 1
conv, ``W_l^T h + b_l``; only that conv depends on the prior. Its loss is
a quality focal loss over the locations the assigner labels (positives:
a class and a soft IoU target; negatives: background) divided by the sum
of the positives' targets, and LoMa on the positives' assigned class.

Per image the cache keeps, as the Q "queries" of one layer of the one
cache format (:mod:`.store`), the classification features ``h`` (the
input of each level's ``rtm_cls``) at every positive location and at a
seeded random sample of the negative ones, padded to a fixed Q, and in
``targets.npy`` each location's level, label, quality target and weight:
the head's label weight, times ``negatives / sampled negatives`` for a
sampled negative (so the loss sum stays unbiased), 0 for padding. With
enough locations (``num_locations`` >= the map's) nothing is sampled and
the cached loss is the head's.

The assignment is the frozen detector's, made once: a CaliRTMDet's under
its deployment prior (a plain RTMDet's, the usual baseline, has none).
"""
import contextlib
from typing import Iterable, Optional

import torch
from torch import nn

from ..utils.validation import check_int
from .dense_targets import dense_cls_convs, recording, select_locations
from .samples import normalised_cxcywh
from .store import DecoderCache
from .writer import DecoderCacheWriter, fill_targets_cache

#: cached locations per image when a source names none
DEFAULT_NUM_LOCATIONS = 1024


def is_dense_model(model: nn.Module) -> bool:
    """Whether ``model`` is a one-stage detector whose head a dense cache
    holds (RTMDet, CaliRTMDet)."""
    from mmdet.models.detectors import SingleStageDetector
    if not isinstance(model, SingleStageDetector):
        return False
    try:
        dense_cls_convs(model.bbox_head)
    except TypeError:
        return False
    return True


def _head_loss_records(model: nn.Module, batch: dict) -> tuple:
    """Preprocess a batch (test mode), run the head's loss and return the
    data samples, the per-level classification features and the
    ``get_targets`` record."""
    data = model.data_preprocessor(batch, False)
    samples = data['data_samples']
    feats = model.extract_feat(data['inputs'])
    head = model.bbox_head
    calibration = model.head_calibration(feats[0], samples) if hasattr(
        model, 'head_calibration') else contextlib.nullcontext()
    with calibration, recording(head) as (levels, record):
        head.loss(feats, samples)
    if len(levels) != head.prior_generator.num_levels or \
            record.get('targets') is None:
        raise RuntimeError(
            f'{type(head).__name__}.loss made {len(levels)} classification '
            'calls and no usable assignment: not an RTMDet-like head')
    return samples, levels, record


def run_dense_head(model: nn.Module, batch: dict, num_locations: int,
                   generator: torch.Generator) -> tuple:
    """Run a one-stage detector's head loss on a batch and keep, per
    image, the classification features and targets of its positive and
    a sample of its negative locations (see the module).

    Args:
        model (nn.Module): RTMDet or CaliRTMDet (eval mode).
        batch (dict): ``dict(inputs=[...], data_samples=[...])``.
        num_locations (int): Q, the cached locations per image.
        generator (torch.Generator): draws the negatives.

    Returns:
        tuple: the data samples, the features (1, B, Q, d), the boxes
        (1, B, Q, 4) (normalised cxcywh) and the targets (B, Q, 4):
        level, label, quality score, weight.
    """
    samples, levels, record = _head_loss_records(model, batch)
    num_classes = model.bbox_head.num_classes
    b, d = levels[0].shape[:2]
    feats = torch.cat(
        [f.permute(0, 2, 3, 1).reshape(b, -1, d) for f in levels], 1)
    level_of = torch.cat([
        feats.new_full((f.shape[2] * f.shape[3], ), float(k))
        for k, f in enumerate(levels)
    ])
    # (anchors, labels, label weights, box targets, assign metrics, ...)
    labels, weights, _, scores = (
        torch.cat(t, 1) for t in record['targets'][1:5])
    boxes = torch.stack([
        normalised_cxcywh(bboxes, sample.metainfo['img_shape'])
        for bboxes, sample in zip(record['bboxes'], samples)
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
        model (nn.Module): RTMDet or CaliRTMDet.
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
