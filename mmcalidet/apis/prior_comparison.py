# Copyright (c) mmcalidet contributors. All rights reserved.
"""What changed between two predictions of one image (e.g. under two
priors): the detections at or above a score threshold, matched by label
and box, their scores compared; and the one line the demos print."""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from mmdet.structures import DetDataSample

from ..utils.validation import check_float

#: two detections of one class are the same box at this IoU or more
MATCH_IOU = 0.9
#: two matched detections whose scores differ by more were rescored
SCORE_TOL = 1e-4


def threshold_text(score_thr: float) -> str:
    """A score threshold as given (``0.993`` stays ``0.993``, ``0.005``
    stays ``0.005``): the shortest text that reads back as the number."""
    return repr(float(score_thr))


def count_by_class(pred: DetDataSample, score_thr: float) -> Dict[int, int]:
    """Detections at or above ``score_thr`` per class index.

    Args:
        pred (DetDataSample): a prediction with ``pred_instances``.
        score_thr (float): the score threshold.

    Returns:
        dict[int, int]: class index -> count (classes with none left out).
    """
    instances = pred.pred_instances
    labels = instances.labels[instances.scores >= score_thr]
    found, counts = np.unique(labels.cpu().numpy(), return_counts=True)
    return {int(k): int(n) for k, n in zip(found, counts)}


def _kept(pred: DetDataSample, score_thr: float) -> tuple:
    """``(boxes (N, 4), scores (N,), labels (N,))`` at or above the
    threshold, as NumPy arrays."""
    instances = pred.pred_instances
    if 'bboxes' not in instances:
        raise ValueError('a prediction to compare needs pred_instances '
                         'with bboxes, scores and labels')
    keep = (instances.scores >= score_thr).cpu().numpy()
    return tuple(
        np.asarray(instances[key].detach().cpu().numpy())[keep]
        for key in ('bboxes', 'scores', 'labels'))


def box_iou(boxes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """(N, M) IoU of x1 y1 x2 y2 boxes (0 for boxes of no area)."""
    boxes, others = (
        np.asarray(b, np.float64).reshape(-1, 4) for b in (boxes, others))
    low = np.maximum(boxes[:, None, :2], others[None, :, :2])
    high = np.minimum(boxes[:, None, 2:], others[None, :, 2:])
    inter = np.clip(high - low, 0, None).prod(-1)

    def area(b):
        return np.clip(b[:, 2:] - b[:, :2], 0, None).prod(-1)

    union = area(boxes)[:, None] + area(others)[None] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match_class(boxes: np.ndarray, others: np.ndarray,
                iou_thr: float) -> List[tuple]:
    """Pairs ``(i, j)`` of two lists of one class's boxes, the highest
    IoU first, each box in one pair at most, IoU >= ``iou_thr``."""
    iou = box_iou(boxes, others)
    pairs = []
    while iou.size and iou.max() >= iou_thr:
        i, j = np.unravel_index(int(iou.argmax()), iou.shape)
        pairs.append((int(i), int(j)))
        iou[i, :] = -1
        iou[:, j] = -1
    return pairs


def prior_changes(pred: DetDataSample,
                  other: DetDataSample,
                  classes: Sequence[str],
                  score_thr: float,
                  iou_thr: float = MATCH_IOU,
                  score_tol: float = SCORE_TOL) -> List[Dict[str, Any]]:
    """The classes whose detections differ between two predictions of the
    same image (e.g. under two priors): the detections at or above
    ``score_thr`` of each, matched by label and box (IoU >= ``iou_thr``,
    the best overlap first), a matched pair's scores compared.

    Args:
        pred (DetDataSample): the first prediction.
        other (DetDataSample): the second one.
        classes (Sequence[str]): the class names.
        score_thr (float): compare detections at or above this score.
        iou_thr (float): the overlap at which two boxes are one.
        score_tol (float): the largest score difference of a pair that
            is not a change.

    Returns:
        list[dict]: for each class whose detections differ (a count, a box
        without a partner, or a score moved by more than ``score_tol``):
        ``class_name``, ``count``, ``other_count``, ``paired`` (the pairs
        of one box), ``rescored`` (the pairs whose score moved) and
        ``max_score_change``; the largest change first.
    """
    check_float('iou_thr', iou_thr, 0, 1)
    check_float('score_tol', score_tol, 0)
    check_float('score_thr', score_thr, 0, 1)
    boxes, scores, labels = _kept(pred, score_thr)
    o_boxes, o_scores, o_labels = _kept(other, score_thr)
    changes = []
    for k in sorted({*labels.tolist(), *o_labels.tolist()}):
        mine, theirs = labels == k, o_labels == k
        pairs = match_class(boxes[mine], o_boxes[theirs], iou_thr)
        moved = np.array([
            abs(float(o_scores[theirs][j]) - float(scores[mine][i]))
            for i, j in pairs
        ])
        count, other_count = int(mine.sum()), int(theirs.sum())
        rescored = int((moved > score_tol).sum())
        if count == other_count == len(pairs) and not rescored:
            continue
        changes.append(
            dict(
                class_name=classes[k] if k < len(classes) else str(k),
                count=count,
                other_count=other_count,
                paired=len(pairs),
                rescored=rescored,
                max_score_change=float(moved.max()) if rescored else 0.0))
    changes.sort(key=lambda c: (-abs(c['other_count'] - c['count']), -(max(
        c['count'], c['other_count']) - c['paired']), -c['max_score_change']))
    return changes


def _describe_class(change: Dict[str, Any]) -> str:
    """``'person 2 -> 1 (1 paired; 1 rescored by up to 0.12)'``."""
    details = []
    if change['paired'] < max(change['count'], change['other_count']):
        details.append(f'{change["paired"]} paired')
    if change.get('rescored'):
        details.append(f'{change["rescored"]} rescored by up to '
                       f'{change["max_score_change"]:.3g}')
    text = f'{change["class_name"]} {change["count"]} -> ' \
        f'{change["other_count"]}'
    return text + (f' ({"; ".join(details)})' if details else '')


def describe_changes(changes: List[Dict[str, Any]],
                     score_thr: float,
                     compared: Optional[int] = None) -> str:
    """One line for :func:`prior_changes`, the threshold as given.

    Args:
        changes (list[dict]): :func:`prior_changes`'s list.
        score_thr (float): its threshold.
        compared (int, optional): how many detections the first
            prediction has at or above it (said when nothing changed).

    Returns:
        str: e.g. ``'changed at score >= 0.3: person 2 -> 1 (1 paired)'``,
        or ``'same 4 detections at score >= 0.3 (labels, boxes at IoU >=
        0.9, scores within 0.0001)'``.
    """
    thr = threshold_text(score_thr)
    if not changes:
        what = 'same detections' if compared is None else \
            f'same {compared} detection{"" if compared == 1 else "s"}'
        return (f'{what} at score >= {thr} (labels, boxes at IoU >= '
                f'{MATCH_IOU:g}, scores within {SCORE_TOL:g})')
    return f'changed at score >= {thr}: ' + ', '.join(
        _describe_class(c) for c in changes)
