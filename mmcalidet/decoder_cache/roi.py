# Copyright (c) mmcalidet contributors. All rights reserved.
"""Box-head caches: what a two-stage detector's classification loss needs.

A two-stage detector (Faster R-CNN, or its calibrated CaliFasterRCNN)
classifies the RoIs its training sampler draws from the RPN's proposals
(positives and negatives) with one linear layer on the shared fcs'
output: K + 1 softmax logits, the last one background. Only that
classifier depends on the prior (:class:`~mmcalidet.models.head_kinds.
RoIKind`); its loss is the box head's cross-entropy over the batch's RoIs
of positive label weight and LoMa on the positives' target class.

Per image the cache keeps, as the Q "queries" of one layer of the one
cache format (:mod:`.store`, ``head='roi'``), the classifier's input of
every RoI the sampler drew in one training-mode ``loss`` call of the
frozen detector (eval mode: batch-norm statistics frozen), padded to a
fixed Q (at least the sampler's ``num``), the RoIs' boxes (normalised cx,
cy, w, h) and in ``targets.npy`` each RoI's level (0), label (K:
background), 1 for a positive (else 0) and the head's label weight; 0 for
padding.

The RoIs and their features do not depend on the prior (the RPN and the
shared fcs are not calibrated): a plain Faster R-CNN and a CaliFasterRCNN
of the same weights make the same cache.
"""
from typing import Iterable, Optional

import torch
from mmdet.structures import SampleList
from torch import Tensor, nn

from ..utils.validation import check_int
from .roi_targets import pad_rois, recording_rois
from .samples import normalised_cxcywh
from .store import DecoderCache
from .writer import DecoderCacheWriter, fill_targets_cache


def is_roi_model(model: nn.Module) -> bool:
    """Whether ``model`` is a two-stage detector whose box head a RoI cache
    holds (Faster R-CNN, CaliFasterRCNN)."""
    from ..models.head_kinds import ROI, find_head_kind
    if find_head_kind(model) is not ROI or not model.with_roi_head:
        return False
    try:
        ROI.cls_layer(ROI.head(model))
    except TypeError:
        return False
    return True


def default_num_rois(model: nn.Module) -> int:
    """The RoIs the training sampler draws per image (``rcnn.sampler.num``):
    a RoI cache's default Q.

    Args:
        model (nn.Module): a two-stage detector.

    Returns:
        int: the sampler's ``num``.
    """
    return int(model.train_cfg.rcnn.sampler.num)


def _roi_targets(record: dict, image: int, num_rois: int,
                 num_classes: int) -> Tensor:
    """(Q, 4) level, label, positive, weight of one image's RoIs."""
    images = record['rois'][:, 0]
    labels = record['labels'].float()
    weights = record['label_weights'].float()
    positive = (labels < num_classes).float()
    rows = torch.stack(
        [torch.zeros_like(labels), labels, positive * (weights > 0), weights],
        -1)
    targets = pad_rois(rows, images, image, num_rois)
    # padding: background label, weight 0
    targets[int((images == image).sum()):, 1] = num_classes
    return targets


def run_roi_head(model: nn.Module,
                 batch: dict,
                 num_rois: Optional[int] = None) -> tuple:
    """Run a two-stage detector's training losses (mmdet's
    ``TwoStageDetector.loss``) on a batch (test-mode preprocessing) and
    keep, per image, the classification features,
    boxes and targets of the RoIs its sampler drew (see the module).

    Args:
        model (nn.Module): Faster R-CNN or CaliFasterRCNN (eval mode).
        batch (dict): ``dict(inputs=[...], data_samples=[...])``.
        num_rois (int, optional): Q, the cached RoIs per image (default
            :func:`default_num_rois`).

    Returns:
        tuple: the data samples, the features (1, B, Q, d), the boxes
        (1, B, Q, 4) (normalised cxcywh) and the targets (B, Q, 4):
        level, label, positive, weight.
    """
    num_rois = int(num_rois or default_num_rois(model))
    data = model.data_preprocessor(batch, False)
    samples: SampleList = data['data_samples']
    from mmdet.models.detectors import TwoStageDetector

    # mmdet's two-stage losses, without a CaliFasterRCNN's calibration
    # (neither the RoIs nor the classifier's input depend on the prior)
    # and with any loss of a calibrator model
    with recording_rois(model.roi_head.bbox_head) as record:
        TwoStageDetector.loss(model, data['inputs'], samples)
    if 'rois' not in record:
        raise RuntimeError(f'{type(model).__name__}.loss computed no box '
                           'loss: not a Faster R-CNN-like detector')
    num_classes = model.roi_head.bbox_head.num_classes
    images, rois = record['rois'][:, 0], record['rois'][:, 1:]
    hidden, boxes, targets = [], [], []
    for i, sample in enumerate(samples):
        hidden.append(pad_rois(record['feats'], images, i, num_rois))
        boxes.append(
            pad_rois(
                normalised_cxcywh(rois, sample.metainfo['img_shape']), images,
                i, num_rois))
        targets.append(_roi_targets(record, i, num_rois, num_classes))
    return (samples, torch.stack(hidden)[None], torch.stack(boxes)[None],
            torch.stack(targets))


def fill_roi_cache(model: nn.Module,
                   data: Iterable[dict],
                   writer: DecoderCacheWriter,
                   num_rois: Optional[int] = None,
                   progress: bool = True,
                   total: Optional[int] = None,
                   desc: str = 'RoI cache',
                   seed: Optional[int] = None) -> DecoderCache:
    """Run a two-stage detector (eval mode, no gradients) over batches into
    a writer and commit it (a failure removes what was written). The
    sampler draws from torch's global generator: seed it for a repeatable
    cache.

    Args:
        model (nn.Module): Faster R-CNN or CaliFasterRCNN.
        data (Iterable[dict]): batches as a data loader yields them.
        writer (DecoderCacheWriter): where the RoIs go.
        num_rois (int, optional): Q; defaults to :func:`default_num_rois`.
        progress (bool): show a progress bar.
        total (int, optional): images, for the progress bar.
        desc (str): the progress bar's label.
        seed (int, optional): unused (the caller seeds torch's global
            generator); taken as the other kinds' cache writers take it.

    Returns:
        DecoderCache: the cache (``head='roi'``).
    """
    num_rois = check_int(
        'num_rois', default_num_rois(model) if num_rois is None else num_rois,
        1)
    model.eval()
    writer.info.update(
        num_levels=1,
        num_classes=int(model.roi_head.bbox_head.num_classes),
        num_locations=num_rois)
    return fill_targets_cache(
        lambda batch: run_roi_head(model, batch, num_rois), data, writer,
        'roi', progress, total, desc)
