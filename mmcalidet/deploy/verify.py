# Copyright (c) mmcalidet contributors. All rights reserved.
"""Check an export against PyTorch: the same detections on real images
under two priors, and priors that move scores, never boxes."""
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from torch import nn

from ..utils.validation import check_float
from .export import ExportWrapper, input_sample
from .runtime import OnnxDetector


def query_boxes(model: nn.Module, tensor: torch.Tensor) -> np.ndarray:
    """Every decoder query's box (the last layer's, x1 y1 x2 y2 in the
    input's pixels): the boxes any prior's detections are drawn from.

    Args:
        model (nn.Module): a (Cali)DETR in eval mode.
        tensor (Tensor): its input, (1, 3, H, W).

    Returns:
        np.ndarray: (Q, 4).
    """
    height, width = tensor.shape[-2:]
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
            report['max_box_diff'] = max(
                report['max_box_diff'],
                float(np.abs(dets[:, :4] - ref_dets[:, :4]).max()))
            report['max_score_diff'] = max(
                report['max_score_diff'],
                float(np.abs(dets[:, 4] - ref_dets[:, 4]).max()))
            report['labels_equal'] &= bool(
                np.array_equal(labels,
                               ref_labels.cpu().numpy()))
            nearest = np.abs(dets[:, None, :4] - queries[None]).max(-1).min(1)
            report['boxes_fixed'] &= bool((nearest <= atol).all())
            scores.append(np.sort(dets[:, 4]))
        for other in scores[1:]:
            report['score_shift'] = max(report['score_shift'],
                                        float(np.abs(other - scores[0]).max()))
    failures = []
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
    report['failures'] = failures
    report['ok'] = not failures
    return report
