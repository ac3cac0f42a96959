# Copyright (c) mmcalidet contributors. All rights reserved.
"""A one-stage detector's post-processing in NumPy, for ONNX Runtime.

An exported one-stage detector's graph ends at every location's box and
class scores (``boxes`` N x 4, ``scores`` N x K); what mmdet's dense heads
do next (``BaseDenseHead._predict_by_feat_single`` and
``_bbox_post_process`` with ``batched_nms``) runs here, without torch or
mmcv: per level, the (location, class) pairs scoring above ``score_thr``,
the best ``nms_pre`` of them; their scores times the location's score
factor where the head has one (FCOS's centerness); boxes no wider or
taller than
``min_bbox_size`` dropped; a greedy NMS per class (IoU above
``iou_threshold`` suppresses); the best ``max_per_img``.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..utils.validation import check_float, check_int


def postprocess_settings(test_cfg) -> Dict:
    """The settings of a dense head's ``test_cfg`` the post-processing
    reads (JSON-ready).

    Args:
        test_cfg (dict): e.g. RTMDet's ``dict(nms_pre=30000,
            min_bbox_size=0, score_thr=0.001, nms=dict(type='nms',
            iou_threshold=0.65), max_per_img=300)``.

    Returns:
        dict: ``score_thr``, ``nms_pre``, ``min_bbox_size``,
        ``iou_threshold``, ``max_per_img``.

    Raises:
        ValueError: an NMS other than mmcv's plain ``nms``, or a setting
            that is not finite or out of range (naming it).
    """
    nms = dict(test_cfg.get('nms') or {})
    if nms.get('type', 'nms') != 'nms':
        raise ValueError(f'the ONNX export post-processes with a plain NMS, '
                         f'got {nms.get("type")!r}')
    return dict(
        score_thr=check_float('score_thr', test_cfg.get('score_thr', 0), 0, 1),
        nms_pre=check_int('nms_pre', test_cfg.get('nms_pre', -1), -1),
        min_bbox_size=check_float('min_bbox_size',
                                  test_cfg.get('min_bbox_size', -1)),
        iou_threshold=check_float('iou_threshold',
                                  nms.get('iou_threshold', 0.5), 0, 1),
        max_per_img=check_int('max_per_img', test_cfg.get('max_per_img', 100),
                              1))


def nms_keep(boxes: np.ndarray, scores: np.ndarray,
             iou_threshold: float) -> np.ndarray:
    """Greedy NMS of one class: the indices kept, best score first.

    Args:
        boxes (np.ndarray): (N, 4) x1 y1 x2 y2.
        scores (np.ndarray): (N,).
        iou_threshold (float): a box whose IoU with a kept one is above
            this is suppressed.

    Returns:
        np.ndarray: the kept indices.
    """
    order = np.argsort(-scores, kind='stable')
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        x1 = np.maximum(boxes[best, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[best, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[best, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        union = areas[best] + areas[rest] - inter
        iou = np.divide(
            inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[iou <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def dense_detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    level_sizes: Sequence[int],
    settings: Dict,
    score_factors: Optional[np.ndarray] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Detections from every location's box and scores.

    Args:
        boxes (np.ndarray): (N, 4) every location's box (clipped to the
            input), the levels one after the other.
        scores (np.ndarray): (N, K) their class scores (after the
            sigmoid).
        level_sizes (Sequence[int]): the locations of each level.
        settings (dict): :func:`postprocess_settings`.
        score_factors (np.ndarray, optional): (N,) a factor of each
            location's scores applied after the top-k, before the NMS
            (mmdet's ``score_factors``: FCOS's centerness).

    Returns:
        tuple[np.ndarray, np.ndarray]: ``dets`` (M, 5: box and score),
        best first, and ``labels`` (M,).
    """
    if sum(level_sizes) != len(boxes) or len(boxes) != len(scores) or (
            score_factors is not None and len(score_factors) != len(boxes)):
        raise ValueError(f'{len(boxes)} boxes and {len(scores)} score rows '
                         f'for levels of {list(level_sizes)} locations' +
                         ('' if score_factors is
                          None else f' ({len(score_factors)} score factors)'))
    picked_boxes, picked_scores, picked_labels = [], [], []
    start = 0
    for size in level_sizes:
        level_scores = scores[start:start + size]
        locations, labels = np.nonzero(level_scores > settings['score_thr'])
        values = level_scores[locations, labels]
        order = np.argsort(-values, kind='stable')
        if settings['nms_pre'] > 0:
            order = order[:settings['nms_pre']]
        picked_boxes.append(boxes[start + locations[order]])
        if score_factors is not None:
            values = values * score_factors[start + locations]
        picked_scores.append(values[order])
        picked_labels.append(labels[order])
        start += size
    det_boxes = np.concatenate(picked_boxes).reshape(-1, 4)
    det_scores = np.concatenate(picked_scores)
    det_labels = np.concatenate(picked_labels).astype(np.int64)
    if settings['min_bbox_size'] >= 0:
        wide = det_boxes[:, 2] - det_boxes[:, 0] > settings['min_bbox_size']
        tall = det_boxes[:, 3] - det_boxes[:, 1] > settings['min_bbox_size']
        valid = wide & tall
        det_boxes, det_scores, det_labels = (det_boxes[valid],
                                             det_scores[valid],
                                             det_labels[valid])
    return class_aware_nms(det_boxes, det_scores, det_labels,
                           settings['iou_threshold'], settings['max_per_img'])


def class_aware_nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                    iou_threshold: float,
                    max_per_img: int) -> Tuple[np.ndarray, np.ndarray]:
    """mmcv's ``batched_nms`` and the best ``max_per_img``: a greedy NMS
    per class, the kept detections best first.

    Args:
        boxes (np.ndarray): (N, 4) x1 y1 x2 y2.
        scores (np.ndarray): (N,).
        labels (np.ndarray): (N,) their classes.
        iou_threshold (float): see :func:`nms_keep`, in [0, 1].
        max_per_img (int): the most detections kept (>= 1).

    Returns:
        tuple[np.ndarray, np.ndarray]: ``dets`` (M, 5: box and score) and
        ``labels`` (M,).

    Raises:
        ValueError: a setting that is not finite or out of range.
    """
    iou_threshold = check_float('iou_threshold', iou_threshold, 0, 1)
    max_per_img = check_int('max_per_img', max_per_img, 1)
    kept = []
    for label in np.unique(labels):
        index = np.nonzero(labels == label)[0]
        kept.append(index[nms_keep(boxes[index], scores[index],
                                   iou_threshold)])
    kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    kept = kept[np.argsort(-scores[kept], kind='stable')][:max_per_img]
    dets = np.concatenate([boxes[kept], scores[kept, None]], axis=1)
    return dets.astype(np.float32), labels[kept].astype(np.int64)
