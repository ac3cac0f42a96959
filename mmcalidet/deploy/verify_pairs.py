# Copyright (c) mmcalidet contributors. All rights reserved.
"""How :func:`~mmcalidet.deploy.verify.verify_onnx` pairs an export's
outputs with PyTorch's (detections by label, score and box; a two-stage
graph's RoIs by their boxes) and what it reports as failed, the number of
pairs included: a check that paired nothing compared nothing."""
from typing import Dict, List, Optional, Tuple

import numpy as np

#: the fewest detections a verification must pair (``min_paired``)
MIN_PAIRED = 1


def match_detections(dets: np.ndarray, labels: np.ndarray,
                     ref_dets: np.ndarray, ref_labels: np.ndarray,
                     atol: float) -> np.ndarray:
    """The order of the reference detections that pairs each with an
    exported one: same label, score and box within ``atol`` (the nearest
    box first). Detections whose scores tie (a one-stage head scores many
    locations alike) may come in any order from two sorts; a detection
    without a partner keeps its place, so the comparison then fails.

    Args:
        dets (np.ndarray): (N, 5) the export's detections.
        labels (np.ndarray): (N,) their labels.
        ref_dets (np.ndarray): (M, 5) PyTorch's.
        ref_labels (np.ndarray): (M,) their labels.
        atol (float): the largest box or score difference of a pair.

    Returns:
        np.ndarray: indices into the reference, one per reference
        detection.
    """
    free = list(range(len(ref_dets)))
    order = []
    for det, label in zip(dets, labels):
        best, best_diff = None, np.inf
        for j in free:
            if ref_labels[j] != label or \
                    abs(ref_dets[j, 4] - det[4]) > atol:
                continue
            diff = float(np.abs(ref_dets[j, :4] - det[:4]).max())
            if diff < best_diff:
                best, best_diff = j, diff
        if best is None or best_diff > atol:
            return np.arange(len(ref_dets))
        order.append(best)
        free.remove(best)
    return np.asarray(order + free, dtype=np.int64)


def pair_dense_detections(
        dets: np.ndarray, labels: np.ndarray, ref_dets: np.ndarray,
        ref_labels: np.ndarray, atol: float,
        max_per_img: Optional[int]) -> Optional[Tuple[np.ndarray, ...]]:
    """A one-stage detector's detections from the export and PyTorch,
    paired (:func:`match_detections`). A full list (``max_per_img``)
    ends among tied scores that either side may have cut differently:
    the detections scoring within ``atol`` of the lower of the two lists'
    last scores are left out.

    Returns:
        tuple | None: ``(dets, labels, ref_dets, ref_labels)`` in paired
        order, or ``None`` if the numbers of detections differ.
    """
    if max_per_img and len(dets) and len(ref_dets) and \
            max(len(dets), len(ref_dets)) >= max_per_img:
        floor = max(dets[:, 4].min(), ref_dets[:, 4].min()) + atol
        keep, ref_keep = dets[:, 4] > floor, ref_dets[:, 4] > floor
        dets, labels = dets[keep], labels[keep]
        ref_dets, ref_labels = ref_dets[ref_keep], ref_labels[ref_keep]
    if len(dets) != len(ref_dets):
        return None
    order = match_detections(dets, labels, ref_dets, ref_labels, atol)
    return dets, labels, ref_dets[order], ref_labels[order]


def compare_detections(report: Dict, dets: np.ndarray, labels: np.ndarray,
                       ref_dets: np.ndarray, ref_labels: np.ndarray,
                       queries: np.ndarray, atol: float) -> None:
    """Fold one comparison of the export's detections with PyTorch's
    (paired in order) into ``report``: the largest box and score
    differences, whether the labels are equal and every box is one of
    ``queries``."""
    report['max_box_diff'] = max(
        report['max_box_diff'],
        float(np.abs(dets[:, :4] - ref_dets[:, :4]).max()))
    report['max_score_diff'] = max(
        report['max_score_diff'],
        float(np.abs(dets[:, 4] - ref_dets[:, 4]).max()))
    report['labels_equal'] &= bool(np.array_equal(labels, ref_labels))
    nearest = np.abs(dets[:, None, :4] - queries[None]).max(-1).min(1)
    report['boxes_fixed'] &= bool((nearest <= atol).all())


def report_failures(report: Dict,
                    atol: float,
                    min_paired: int = MIN_PAIRED) -> List[str]:
    """What a verification ``report`` found wrong, one line each: a
    difference, or fewer than ``min_paired`` detections paired (nothing,
    or too little, was compared), or a two-stage graph's RoIs not all
    paired with PyTorch's."""
    failures = []
    if report.get('blank_error'):
        failures.append('ONNX Runtime fails on a blank image: '
                        f'{report["blank_error"]}')
    if report.get('padding'):
        failures.append(report['padding'])
    if not report.get('counts_equal', True):
        failures.append('the number of detections differs from PyTorch')
    if report.get('paired', 0) < min_paired:
        failures.append(
            f'only {report.get("paired", 0)} detection(s) paired with '
            f'PyTorch\'s on {report["images"]} input(s) (at least '
            f'{min_paired} needed): nothing to compare, a model that '
            'detects nothing at its score_thr (random weights?)')
    if 'rois' in report and report['rois_paired'] < sum(report['rois']):
        failures.append(
            f'{report["rois_paired"]} of {sum(report["rois"])} RoIs paired '
            'with PyTorch\'s (same box for every class)')
    if report['max_box_diff'] > atol:
        failures.append(f'boxes differ from PyTorch by up to '
                        f'{report["max_box_diff"]:.2e} (> {atol:g})')
    if report['max_score_diff'] > atol:
        failures.append(f'scores differ from PyTorch by up to '
                        f'{report["max_score_diff"]:.2e} (> {atol:g})')
    if not report['labels_equal']:
        failures.append('labels differ from PyTorch')
    if not report['boxes_fixed']:
        failures.append('a prior moved a box (a detection is not a '
                        'decoder query\'s box)')
    return failures


def pair_rois(boxes: np.ndarray, ref_boxes: np.ndarray, atol: float) -> int:
    """How many of a two-stage graph's RoIs have a PyTorch RoI whose box
    for every class is the same within ``atol`` (each PyTorch RoI paired
    once; the nearest first-class box first, so that two sorts' orders
    of the RoIs do not matter).

    Args:
        boxes (np.ndarray): (N, K, 4) the graph's ``boxes`` output.
        ref_boxes (np.ndarray): (M, K, 4) PyTorch's.
        atol (float): the largest coordinate difference of a pair.

    Returns:
        int: the RoIs paired (N when all are, and N == M).
    """
    if not len(boxes) or not len(ref_boxes):
        return 0
    first = np.abs(boxes[:, None, 0] - ref_boxes[None, :, 0]).max(-1)
    free = np.ones(len(ref_boxes), bool)
    paired = 0
    for i in np.argsort(first.min(1), kind='stable'):
        candidates = np.flatnonzero(free & (first[i] <= atol))
        for j in candidates[np.argsort(first[i, candidates])]:
            if np.abs(boxes[i] - ref_boxes[j]).max() <= atol:
                free[j] = False
                paired += 1
                break
    return paired
