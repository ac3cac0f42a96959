# Copyright (c) mmcalidet contributors. All rights reserved.
"""A two-stage detector's last post-processing in NumPy, for ONNX Runtime.

An exported two-stage detector's graph ends at every RoI's per-class box
and class scores (``boxes`` N x K x 4, ``scores`` N x K); what mmdet's
box head does next (``multiclass_nms``) runs here, without torch or mmcv:
the (RoI, class) pairs scoring above ``score_thr``, a greedy NMS per class
(IoU above ``iou_threshold`` suppresses), the best ``max_per_img``.
"""
from typing import Dict, Tuple

import numpy as np

from ..utils.validation import check_float
from .dense_postprocess import class_aware_nms, postprocess_settings


def roi_postprocess_settings(rcnn_test_cfg) -> Dict:
    """The settings of a RoI head's ``test_cfg`` the post-processing reads
    (JSON-ready).

    Args:
        rcnn_test_cfg (dict): e.g. Faster R-CNN's ``dict(score_thr=0.05,
            nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)``.

    Returns:
        dict: ``score_thr``, ``iou_threshold``, ``max_per_img``.

    Raises:
        ValueError: an NMS other than mmcv's plain ``nms``, or a setting
            out of range (naming it).
    """
    settings = postprocess_settings(rcnn_test_cfg)  # the same checks
    return {
        key: settings[key]
        for key in ('score_thr', 'iou_threshold', 'max_per_img')
    }


def roi_detections(boxes: np.ndarray, scores: np.ndarray,
                   settings: Dict) -> Tuple[np.ndarray, np.ndarray]:
    """Detections from every RoI's per-class boxes and scores.

    Args:
        boxes (np.ndarray): (N, K, 4) every RoI's box for each class (N
            is the input's: any number, none included).
        scores (np.ndarray): (N, K) its class scores (the softmax, the
            background left out).
        settings (dict): :func:`roi_postprocess_settings`.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``dets`` (M, 5: box and score),
        best first, and ``labels`` (M,).

    Raises:
        ValueError: arrays of other shapes, or a setting that is not
            finite or out of range.
    """
    score_thr = check_float('score_thr', settings['score_thr'], 0, 1)
    if boxes.ndim != 3 or boxes.shape[:2] != scores.shape:
        raise ValueError(f'boxes {boxes.shape} and scores {scores.shape} '
                         'must be (N, K, 4) and (N, K)')
    rois, labels = np.nonzero(scores > score_thr)
    return class_aware_nms(boxes[rois, labels], scores[rois, labels], labels,
                           settings['iou_threshold'], settings['max_per_img'])
