# Copyright (c) mmcalidet contributors. All rights reserved.
"""Check an export against PyTorch: the same detections on real images
under two priors, and priors that move scores, never boxes; a check that
paired too few detections tries further inputs, then fails."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from torch import nn

from ..utils.validation import check_float
from .export import export_wrapper, padding_problem
from .export_meta import head_kind
from .export_wrappers import ExportWrapper, input_sample
from .runtime import OnnxDetector
from .verify_pairs import (MIN_PAIRED, compare_detections,
                           pair_dense_detections, pair_rois, report_failures)

#: stands for the trace's own input (all zeros after the normalisation)
#: among the inputs of :func:`verify_onnx`
TRACE_INPUT = object()

#: the grey of the images without objects (:func:`synthetic_images`)
GREY = 128


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


def _image_shape(input_shape: Sequence[int]) -> Tuple[int, int, int]:
    """``(H, W, 3)`` of a BGR image of the graph's input size.

    Raises:
        ValueError: a size that is not two positive integers.
    """
    if len(input_shape) != 2 or any(int(v) != v or v < 1 for v in input_shape):
        raise ValueError('the input size must be two positive integers '
                         f'(H, W), got {tuple(input_shape)}')
    return int(input_shape[0]), int(input_shape[1]), 3


def blank_image(input_shape: Sequence[int]) -> np.ndarray:
    """A constant grey BGR image of the graph's input size: no objects.

    Args:
        input_shape (Sequence[int]): ``(H, W)``.

    Returns:
        np.ndarray: (H, W, 3) uint8.

    Raises:
        ValueError: a size that is not two positive integers.
    """
    return np.full(_image_shape(input_shape), GREY, np.uint8)


def synthetic_images(input_shape: Sequence[int],
                     seed: int = 0) -> List[np.ndarray]:
    """Two BGR images of the graph's input size that :func:`verify_onnx`
    compares on beside the real ones: grey without objects (with a faint
    noise of two grey levels at most) and uniform noise. A two-stage
    graph's RPN keeps as many proposals as an input's content gives (the
    export traced an all-zero input): these give other numbers than the
    trace's and the real images'. The grey is not constant: a constant
    image scores its anchors alike, and ONNX Runtime's and PyTorch's
    sorts may keep different ones of equal score (:func:`blank_image` is
    run, not compared).

    Args:
        input_shape (Sequence[int]): ``(H, W)`` of the graph's input.
        seed (int): the noise's seed.

    Returns:
        list[np.ndarray]: the grey and the noise image, (H, W, 3) uint8
        each.

    Raises:
        ValueError: a size that is not two positive integers.
    """
    shape = _image_shape(input_shape)
    rng = np.random.default_rng(seed)
    grey = GREY + rng.integers(-2, 3, shape)
    noise = rng.integers(0, 256, shape)
    return [grey.astype(np.uint8), noise.astype(np.uint8)]


def verify_onnx(onnx_file: str,
                model: nn.Module,
                images: Sequence[Any],
                priors: Sequence[Any] = (None, ),
                atol: float = 1e-4,
                synthetic: Optional[bool] = None,
                min_paired: int = MIN_PAIRED,
                fallback: Sequence[Any] = ()) -> Dict:
    """Compare an exported graph in ONNX Runtime with the PyTorch model on
    the same inputs.

    Args:
        onnx_file (str): the export.
        model (nn.Module): the PyTorch model to compare with: the model
            exported, or, for a :func:`fold_prior` graph, the model under
            the folded prior (``set_prior``: its support included).
        images (Sequence): image files (or BGR arrays).
        priors (Sequence): priors to compare under (a folded graph: only
            ``None``).
        atol (float): the largest difference of a box coordinate (pixels)
            or a score.
        synthetic (bool, optional): also compare on
            :func:`synthetic_images` of the graph's input size (a grey
            image without objects and noise) under the first prior, and
            run the graph on a :func:`blank_image`. ``None`` (default):
            for a two-stage graph, whose number of RoIs is the input's.
        min_paired (int): the fewest detections (over every input and
            prior) that must be paired with PyTorch's; fewer fails.
        fallback (Sequence): further images, compared one at a time under
            every prior while fewer than ``min_paired`` are paired, then
            the trace's own input (:data:`TRACE_INPUT`).

    Returns:
        dict: ``images`` (how many inputs were compared, the synthetic
        and fallback ones included), ``paired`` (the detections paired
        with PyTorch's, every input and prior), ``paired_per_input``,
        ``retried`` (the fallback inputs used), ``max_box_diff``,
        ``max_score_diff``, ``labels_equal``, ``boxes_fixed`` (every
        detection's box is a decoder query's box, whatever the prior),
        ``score_shift`` (how much the priors moved the scores),
        ``padding`` (why the graph's size is not what the model's
        preprocessor gives, or ``None``), ``ok`` and ``failures`` (one
        line each); a two-stage graph's also ``rois`` (the RoIs its RPN
        kept on each input compared but the trace's, whose constant
        anchor scores tie) and ``rois_paired`` (those whose boxes ONNX
        Runtime and PyTorch agree on); with ``synthetic``,
        ``blank_error`` (``None``, or why ONNX Runtime failed on the blank
        image).
    """
    check_float('atol', atol, 0)
    if isinstance(min_paired, bool) or not isinstance(min_paired, int) \
            or min_paired < 0:
        raise ValueError(f'min_paired must be an integer >= 0, got '
                         f'{min_paired!r}')
    detector = OnnxDetector(onnx_file)
    kind = head_kind(model)
    if synthetic is None:
        synthetic = kind == 'roi'
    # (image, how many of the priors it is compared under): the synthetic
    # images check the input's side (the RoIs), under the first prior
    inputs = [(image, len(priors)) for image in images]
    if synthetic:
        inputs += [(image, 1)
                   for image in synthetic_images(detector.meta['input_shape'])]
    model = model.eval()
    wrapper = ExportWrapper(model, detector.meta['input_shape'],
                            detector.prior_input, detector.support_input)
    # (matrix, support) of each prior, read once; a graph with a support
    # input gets zeros (none) for a bare matrix
    resolved = [detector.resolve(p) for p in priors]
    report = dict(
        images=0,
        priors=len(resolved),
        paired=0,
        paired_per_input=[],
        retried=0,
        max_box_diff=0.0,
        max_score_diff=0.0,
        labels_equal=True,
        boxes_fixed=True,
        score_shift=0.0,
        padding=padding_problem(model, detector.meta['input_shape']))
    # a one- or two-stage graph: the runtime runs the last NMS, with the
    # head's settings stored in the file
    if kind != 'detr':
        report['counts_equal'] = True
    if kind == 'roi':
        report['rois'], report['rois_paired'] = [], 0
    if synthetic:  # runs and gives well-formed detections, or fails
        report['blank_error'] = run_blank(detector, *resolved[0])
    for image, num_priors in inputs:
        compare_input(report, detector, wrapper, image, resolved[:num_priors],
                      atol)
    for image in [*fallback, TRACE_INPUT]:
        if report['paired'] >= min_paired:
            break
        report['retried'] += 1
        compare_input(report, detector, wrapper, image, resolved, atol)
    report['failures'] = report_failures(report, atol, min_paired)
    report['ok'] = not report['failures']
    return report


def compare_input(report: Dict, detector: OnnxDetector,
                  wrapper: ExportWrapper, image: Any, resolved: Sequence,
                  atol: float) -> None:
    """Compare one input (an image, or :data:`TRACE_INPUT`) under each of
    the ``resolved`` priors ((matrix, support) pairs) and fold it into
    ``report`` (:func:`verify_onnx`'s)."""
    model = wrapper.model
    device = next(model.parameters()).device
    if image is TRACE_INPUT:
        array = np.zeros((1, 3, *detector.meta['input_shape']), np.float32)
    else:
        array = detector.preprocess(image)[0]
    queries = query_boxes(model, torch.from_numpy(array).to(device))
    report['images'] += 1
    before = report['paired']
    # every RoI's box for each class; not on the trace's constant input,
    # whose anchors score alike (two sorts may keep different RoIs)
    if 'rois' in report and image is not TRACE_INPUT:
        k = detector.num_classes
        report['rois'].append(len(queries) // k)
        boxes = detector.run_graph(array, *resolved[0])[0]
        report['rois_paired'] += pair_rois(
            np.asarray(boxes).reshape(-1, k, 4), queries.reshape(-1, k, 4),
            atol)
    scores: List[np.ndarray] = []
    for matrix, support in resolved:
        found = compare_under(report, detector, wrapper, array, queries,
                              matrix, support, atol)
        if found is not None:
            scores.append(found)
    report['paired_per_input'].append(report['paired'] - before)
    for other in scores[1:]:
        # the best n of each (a one-stage detector keeps as many
        # detections as pass its thresholds under each prior)
        n = min(len(other), len(scores[0]))
        if n:
            report['score_shift'] = max(
                report['score_shift'],
                float(np.abs(other[-n:] - scores[0][-n:]).max()))


def compare_under(report: Dict, detector: OnnxDetector,
                  wrapper: ExportWrapper, array: np.ndarray,
                  queries: np.ndarray, matrix: Optional[np.ndarray],
                  support: Optional[tuple],
                  atol: float) -> Optional[np.ndarray]:
    """Run one input under one prior in ONNX Runtime and in PyTorch and
    fold the comparison into ``report`` (:func:`compare_detections`).

    Args:
        report (dict): the report of :func:`verify_onnx`.
        detector (OnnxDetector): the graph.
        wrapper (ExportWrapper): the PyTorch model's traced forward.
        array (np.ndarray): the input, (1, 3, H, W).
        queries (np.ndarray): the boxes any prior's detections are drawn
            from (:func:`query_boxes`).
        matrix (np.ndarray, optional): the resolved prior.
        support (tuple, optional): its (support, class shares).
        atol (float): the largest box or score difference.

    Returns:
        np.ndarray | None: the graph's sorted scores, ``None`` when a one-
        or two-stage graph's detections could not be paired, or there
        were none (``report['paired']`` counts the pairs).
    """
    device = next(wrapper.model.parameters()).device
    dets, labels = detector.run_input(array, matrix, support)
    prior = None if matrix is None else torch.from_numpy(matrix).to(device)
    extra = ()
    if detector.support_input:
        zeros = np.zeros(detector.num_classes, np.float32)
        extra = tuple(
            torch.from_numpy(t).to(device)
            for t in (support or (zeros, zeros)))
    with torch.no_grad():
        ref_dets, ref_labels = wrapper(
            torch.from_numpy(array).to(device), prior, *extra)
    ref_dets, ref_labels = ref_dets.cpu().numpy(), ref_labels.cpu().numpy()
    if 'counts_equal' in report:  # tied scores: the sorts may differ
        paired = pair_dense_detections(
            dets, labels, ref_dets, ref_labels, atol,
            detector.meta['postprocess']['max_per_img'])
        report['counts_equal'] &= paired is not None
        if paired is None or not len(paired[0]):
            return None
        dets, labels, ref_dets, ref_labels = paired
    if not len(dets):
        return None
    compare_detections(report, dets, labels, ref_dets, ref_labels, queries,
                       atol)
    report['paired'] += len(dets)
    return np.sort(dets[:, 4])


def run_blank(detector: OnnxDetector,
              prior: Optional[np.ndarray] = None,
              support: Optional[tuple] = None) -> Optional[str]:
    """Run a graph on a :func:`blank_image` of its input size.

    Args:
        detector (OnnxDetector): the graph.
        prior (np.ndarray, optional): a resolved prior.
        support (tuple, optional): its (support, class shares).

    Returns:
        str | None: ``None`` if ONNX Runtime gave well-formed detections
        (boxes and scores of as many), else why not, in one line.
    """
    array = detector.preprocess(blank_image(detector.meta['input_shape']))[0]
    try:
        dets, labels = detector.run_input(array, prior, support)
    except Exception as exc:  # ONNX Runtime's own types
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__
    if dets.ndim != 2 or dets.shape[1] != 5 or len(labels) != len(dets):
        return (f'detections of the shape {dets.shape} with '
                f'{len(labels)} labels')
    return None
