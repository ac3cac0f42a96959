# Copyright (c) mmcalidet contributors. All rights reserved.
"""Check an export against PyTorch: the same detections on real images
under two priors, and priors that move scores, never boxes."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from torch import nn

from ..utils.validation import check_float
from .export import ExportWrapper, export_wrapper, head_kind, input_sample
from .runtime import OnnxDetector


def query_boxes(model: nn.Module, tensor: torch.Tensor) -> np.ndarray:
    """Every decoder query's box (the last layer's, x1 y1 x2 y2 in the
    input's pixels; a one-stage detector: every location's; a two-stage
    one: every RoI's box for each class): the boxes any prior's detections
    are drawn from.

    Args:
        model (nn.Module): a (Cali)DETR in eval mode.
        tensor (Tensor): its input, (1, 3, H, W).

    Returns:
        np.ndarray: (Q, 4).
    """
    height, width = tensor.shape[-2:]
    if head_kind(model) != 'detr':  # the graph's boxes output
        with torch.no_grad():
            boxes = export_wrapper(
                model, (height, width), prior_input=False,
                support_input=False)(tensor)[0]
        return boxes.reshape(-1, 4).cpu().numpy()
    with torch.no_grad():
        feats = model.extract_feat(tensor)
        head_inputs = model.forward_transformer(feats,
                                                [input_sample(height, width)])
        outputs = model.bbox_head(
            **{
                key: head_inputs[key]
                for key in ('hidden_states', 'references', 'cali_vectors')
                if key in head_inputs
            })
    boxes = bbox_cxcywh_to_xyxy(outputs[1][-1][0])
    boxes = boxes * boxes.new_tensor([width, height, width, height])
    # as the head's predict clips them
    boxes[:, 0::2] = boxes[:, 0::2].clamp(min=0, max=width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(min=0, max=height)
    return boxes.cpu().numpy()


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


def pair_dense_detections(dets: np.ndarray, labels: np.ndarray,
                          ref_dets: np.ndarray, ref_labels: np.ndarray,
                          atol: float, max_per_img: Optional[int]
                          ) -> Optional[Tuple[np.ndarray, ...]]:
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


def verify_onnx(onnx_file: str,
                model: nn.Module,
                images: Sequence[Any],
                priors: Sequence[Any] = (None, ),
                atol: float = 1e-4) -> Dict:
    """Compare an exported graph in ONNX Runtime with the PyTorch model on
    the same inputs.

    Args:
        onnx_file (str): the export.
        model (nn.Module): the model exported (a :func:`fold_prior` copy
            for a folded graph).
        images (Sequence): image files (or BGR arrays).
        priors (Sequence): priors to compare under (a folded graph: only
            ``None``).
        atol (float): the largest difference of a box coordinate (pixels)
            or a score.

    Returns:
        dict: ``max_box_diff``, ``max_score_diff``, ``labels_equal``,
        ``boxes_fixed`` (every detection's box is a decoder query's box,
        whatever the prior), ``score_shift`` (how much the priors moved
        the scores), ``ok`` and ``failures`` (one line each).
    """
    check_float('atol', atol, 0)
    detector = OnnxDetector(onnx_file)
    model = model.eval()
    wrapper = ExportWrapper(model, detector.meta['input_shape'],
                            detector.prior_input, detector.support_input)
    matrices = [detector.resolve_prior(p) for p in priors]
    # a graph with a support input: each prior's, zeros (none) for a matrix
    supports = [detector.resolve_support(p) for p in priors]
    report = dict(
        images=len(images),
        priors=len(matrices),
        max_box_diff=0.0,
        max_score_diff=0.0,
        labels_equal=True,
        boxes_fixed=True,
        score_shift=0.0)
    device = next(model.parameters()).device
    # a one- or two-stage graph: the runtime runs the last NMS, with the
    # head's settings stored in the file
    dense = head_kind(model) != 'detr'
    if dense:
        report['counts_equal'] = True
        max_per_img = detector.meta['postprocess']['max_per_img']
    for image in images:
        array, _, _ = detector.preprocess(image)
        tensor = torch.from_numpy(array).to(device)
        queries = query_boxes(model, tensor)
        scores: List[np.ndarray] = []
        for matrix, support in zip(matrices, supports):
            dets, labels = detector.run_input(array, matrix, support)
            prior = None if matrix is None else torch.from_numpy(matrix).to(
                device)
            extra = ()
            if detector.support_input:
                zeros = np.zeros(detector.num_classes, np.float32)
                extra = tuple(
                    torch.from_numpy(t).to(device)
                    for t in (support or (zeros, zeros)))
            with torch.no_grad():
                ref_dets, ref_labels = wrapper(tensor, prior, *extra)
            ref_dets = ref_dets.cpu().numpy()
            ref_labels = ref_labels.cpu()
            if dense:  # tied scores: mmdet's and NumPy's sorts may differ
                paired = pair_dense_detections(dets, labels, ref_dets,
                                               ref_labels.numpy(), atol,
                                               max_per_img)
                report['counts_equal'] &= paired is not None
                if paired is None or not len(paired[0]):
                    continue
                dets, labels, ref_dets, ref_labels = paired
                ref_labels = torch.from_numpy(ref_labels)
            compare_detections(report, dets, labels, ref_dets,
                               ref_labels.numpy(), queries, atol)
            scores.append(np.sort(dets[:, 4]))
        for other in scores[1:]:
            # the best n of each (a one-stage detector keeps as many
            # detections as pass its thresholds under each prior)
            n = min(len(other), len(scores[0]))
            if n:
                report['score_shift'] = max(
                    report['score_shift'],
                    float(np.abs(other[-n:] - scores[0][-n:]).max()))
    report['failures'] = report_failures(report, atol)
    report['ok'] = not report['failures']
    return report


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


def report_failures(report: Dict, atol: float) -> List[str]:
    """What a verification ``report`` found wrong, one line each."""
    failures = []
    if not report.get('counts_equal', True):
        failures.append('the number of detections differs from PyTorch')
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
