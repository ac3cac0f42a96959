# Copyright (c) mmcalidet contributors. All rights reserved.
"""Data samples to and from what a decoder cache stores of them: the
metainfo the heads and evaluators read, and the ground-truth boxes and
classes."""
from typing import Dict, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import bbox_xyxy_to_cxcywh
from mmengine.structures import InstanceData

#: metainfo keys kept per image (what the DETR losses, ``predict_by_feat``
#: and the COCO evaluators read)
META_KEYS = ('img_id', 'img_path', 'ori_shape', 'img_shape', 'pad_shape',
             'scale_factor', 'batch_input_shape', 'flip', 'flip_direction')
#: of these, the ones that are tuples in a data sample
TUPLE_KEYS = ('ori_shape', 'img_shape', 'pad_shape', 'scale_factor',
              'batch_input_shape')


def _jsonable(value):
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def metainfo_record(data_sample: DetDataSample) -> Dict:
    """The JSON-ready metainfo of a data sample (:data:`META_KEYS`)."""
    meta = data_sample.metainfo
    return {k: _jsonable(meta[k]) for k in META_KEYS if k in meta}


def gt_arrays(data_sample: DetDataSample) -> Tuple[np.ndarray, np.ndarray]:
    """Ground-truth boxes (M, 4) float32 (x1, y1, x2, y2 of the transformed
    image) and classes (M,) int64 of a data sample (none without
    ``gt_instances``; crowd boxes, which mmdet keeps in
    ``ignored_instances``, are not kept)."""
    gt = data_sample.get('gt_instances', None)
    if gt is None or 'labels' not in gt:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
    labels = gt.labels.detach().cpu().numpy().astype(np.int64)
    bboxes = gt.get('bboxes', None)
    bboxes = getattr(bboxes, 'tensor', bboxes)
    bboxes = np.zeros((len(labels), 4), np.float32) if bboxes is None \
        else bboxes.detach().cpu().numpy().astype(np.float32).reshape(-1, 4)
    return bboxes, labels


def rebuild_data_sample(metainfo: Dict, bboxes: np.ndarray,
                        labels: np.ndarray) -> DetDataSample:
    """A data sample from what a cache stores: metainfo and
    ``gt_instances`` (``bboxes`` and ``labels`` tensors).

    Args:
        metainfo (dict): a :func:`metainfo_record`.
        bboxes (np.ndarray): (M, 4) ground-truth boxes.
        labels (np.ndarray): (M,) their classes.

    Returns:
        DetDataSample: the sample (CPU tensors).
    """
    meta = {
        k: tuple(v) if k in TUPLE_KEYS and isinstance(v, list) else v
        for k, v in metainfo.items()
    }
    sample = DetDataSample(metainfo=meta)
    gt = InstanceData()
    gt.bboxes = torch.from_numpy(np.array(bboxes, dtype=np.float32))
    gt.labels = torch.from_numpy(np.array(labels, dtype=np.int64))
    sample.gt_instances = gt
    return sample


def strip_data_sample(data_sample: DetDataSample) -> DetDataSample:
    """A CPU copy of a data sample as a cache gives it back: the metainfo
    of :data:`META_KEYS` and the ground truth, no predictions."""
    return rebuild_data_sample(
        metainfo_record(data_sample), *gt_arrays(data_sample))


def with_predictions(data_sample: DetDataSample, pred) -> DetDataSample:
    """A new data sample with the metainfo and ground truth of
    ``data_sample`` and ``pred_instances = pred`` (nothing is copied)."""
    out = DetDataSample(metainfo=data_sample.metainfo)
    for key in ('gt_instances', 'ignored_instances'):
        if key in data_sample:
            out.set_field(data_sample.get(key), key)
    out.pred_instances = pred
    return out


def normalised_cxcywh(bboxes: torch.Tensor,
                      img_shape: Sequence[int]) -> torch.Tensor:
    """Pixel x1, y1, x2, y2 boxes of an image as the caches keep them:
    cx, cy, w, h normalised by the image's width and height.

    Args:
        bboxes (Tensor): (..., 4) boxes.
        img_shape (Sequence[int]): the image's (height, width).

    Returns:
        Tensor: (..., 4) the normalised boxes.
    """
    h, w = img_shape[:2]
    return bbox_xyxy_to_cxcywh(bboxes) / bboxes.new_tensor([w, h, w, h])
