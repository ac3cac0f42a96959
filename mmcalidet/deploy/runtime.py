# Copyright (c) mmcalidet contributors. All rights reserved.
"""Run an exported detector in ONNX Runtime, with a run-time prior.

Needs onnxruntime, numpy and mmcv's image reading only: the class names,
input size, normalisation and the deployment prior come from the file's
metadata (:func:`~mmcalidet.deploy.export.export_onnx`).
"""
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..utils.validation import check_finite_array, check_float, check_int
from .dense_postprocess import dense_detections
from .export_meta import META_KEY
from .roi_postprocess import roi_detections

ImageLike = Union[str, os.PathLike, np.ndarray]


def _is_matrix_row(row: Any) -> bool:
    """Whether an item of a list may be a row of numbers (not a prior)."""
    if isinstance(row, (str, bytes, os.PathLike, dict)) or \
            hasattr(row, 'matrix'):
        return False
    try:
        return np.ndim(row) <= 1
    except ValueError:  # ragged: the matrix's check names it
        return True


def _check_one_prior(prior: Any) -> None:
    """Refuse a list of priors (files, names, dicts or matrices): a graph
    run takes one prior for every image of the call."""
    if not isinstance(prior, (list, tuple)) or not prior:
        return
    if all(_is_matrix_row(row) for row in prior):
        return  # the rows of one K x K matrix
    raise ValueError(f'OnnxDetector takes one prior per call, got a list of '
                     f'{len(prior)} priors: call it once per prior')


class OnnxDetector:
    """An exported detector (a (Cali)DETR, one- or two-stage) in ONNX
    Runtime.

    Each image is resized to the graph's input size (the aspect ratio is
    not kept: a static graph has no padding mask), normalised as the model
    was, and its boxes are mapped back to the original image.

    Args:
        onnx_file (str): a file of :func:`~mmcalidet.deploy.export_onnx`.
        providers (Sequence[str], optional): ONNX Runtime's execution
            providers; defaults to the CPU.
        threads (int, optional): intra-op threads (``None``: ONNX
            Runtime's default).

    Attributes:
        meta (dict): the export's settings (``classes``, ``input_shape``,
            ``prior_input``, ``prior`` ...).
        classes (list[str] | None): class names, by label.
    """
    #: a graph without the support inputs (older exports, and a detector
    #: whose CaliFormer reads no support) takes none
    support_input: bool = False
    default_support: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def __init__(self,
                 onnx_file: str,
                 providers: Optional[Sequence[str]] = None,
                 threads: Optional[int] = None) -> None:
        import onnxruntime as ort
        if not os.path.isfile(onnx_file):
            raise FileNotFoundError(f'ONNX file not found: {onnx_file}')
        check_int('threads', threads, 0, allow_none=True)
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                onnx_file,
                sess_options=options,
                providers=list(providers or ['CPUExecutionProvider']))
        except Exception as exc:  # ONNX Runtime's own types (protobuf ...)
            reason = str(exc).strip().splitlines()[0] if str(exc) else \
                type(exc).__name__
            raise ValueError(f'{onnx_file} is not an ONNX model ONNX Runtime '
                             f'can load: {reason}') from None
        custom = self.session.get_modelmeta().custom_metadata_map
        if META_KEY not in custom:
            raise ValueError(f'{onnx_file} has no {META_KEY} metadata: '
                             'export it with tools/deployment/export_onnx.py')
        self.meta: Dict[str, Any] = json.loads(custom[META_KEY])
        self.onnx_file = onnx_file
        self.classes: Optional[List[str]] = self.meta.get('classes')
        self.num_classes = int(self.meta['num_classes'])
        self.prior_input = bool(self.meta['prior_input'])
        #: the graph also takes the prior's support (experimental)
        self.support_input = bool(self.meta.get('support_input', False))
        self.default_prior = self.default_support = None
        #: the deployment prior the file stores (``None``: none)
        self.stored_prior = None
        if self.meta.get('prior') is not None:
            # the deployment prior the file stores, validated as any prior
            from ..priors.prior import Prior
            self.stored_prior = stored = Prior(
                self.meta['prior'],
                self.classes,
                self.meta.get('prior_support'),
                self.meta.get('prior_marginals'),
                name=f'{onnx_file} (its stored prior)',
                num_classes=self.num_classes)
            self.default_prior = np.asarray(stored.matrix, dtype=np.float32)
            if stored.has_support:
                self.default_support = tuple(
                    np.asarray(t, dtype=np.float32)
                    for t in stored.support_pair())

    def as_prior(self, prior: Any = None):
        """A run-time prior as the :class:`~mmcalidet.priors.Prior` that
        ``set_prior`` takes (matrix, class names and support, in the
        graph's class order), checked for this graph: what a tool resolves
        once and passes to every call, so that the support travels.

        Args:
            prior: see :meth:`resolve`; ``None``: the stored deployment
                prior (its support included).

        Returns:
            Prior | None: the prior; ``None`` for a graph that takes no
            prior (folded, or a plain detector's) given none.

        Raises:
            ValueError: as :meth:`resolve`.
        """
        if not self.prior_input:
            self.resolve(prior)  # refuses a prior, names why
            return None
        if prior is None:
            return self.stored_prior
        from ..priors.prior import Prior
        return Prior.load(
            prior, classes=self.classes, num_classes=self.num_classes)

    def resolve(self, prior: Any = None
                ) -> Tuple[Optional[np.ndarray], Optional[tuple]]:
        """Validate a run-time prior before ONNX Runtime runs: its matrix
        and, for a graph that takes one, its support (read once).

        Args:
            prior: a :class:`~mmcalidet.priors.Prior`, a prior file, a
                shipped name, a K x K matrix or a dict in the prior file
                format (reordered by class name to the model's classes);
                ``None``: the exported deployment prior.

        Returns:
            tuple: the float32 K x K matrix (``None`` for a folded graph
            given no prior) and the (support, class shares), (K,) float32
            each, for a graph with a support input (``None``: none; the
            graph then gets zeros).

        Raises:
            ValueError: one line naming the problem (shape, NaN, values
                outside [0, 1], class names, support), or a prior given to
                a graph whose prior is folded, or a list of priors (one
                prior is given per call).
        """
        _check_one_prior(prior)
        if not self.prior_input:
            if prior is not None and self.meta.get('folded', True):
                raise ValueError(
                    f'{self.onnx_file} has its prior folded into its '
                    'weights: export it with --prior-input to give priors '
                    'at run time')
            if prior is not None:
                raise ValueError(
                    f'{self.onnx_file} is an export of a '
                    f'{self.meta.get("model", "detector")}, which takes no '
                    'prior: give no --prior (or export a CaliDet detector)')
            return None, None
        value = self.as_prior(prior)
        if value is None:  # a graph with a prior input stores one
            return self.default_prior, self.default_support \
                if self.support_input else None
        matrix = np.ascontiguousarray(value.matrix, dtype=np.float32)
        support = None
        if self.support_input and value.has_support:
            support = tuple(
                np.asarray(t, dtype=np.float32) for t in value.support_pair())
        return matrix, support

    def resolve_prior(self, prior: Any = None) -> Optional[np.ndarray]:
        """The matrix of :meth:`resolve`, for checks only: a bare matrix
        given back to the graph carries no support (a tool resolves with
        :meth:`as_prior`, tests/test_reliability/
        test_runtime_prior_path.py keeps tools off this)."""
        return self.resolve(prior)[0]

    def resolve_support(
            self,
            prior: Any = None) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The support of :meth:`resolve`."""
        return self.resolve(prior)[1]

    def preprocess(self, image: ImageLike) -> tuple:
        """An image as the graph's input.

        Args:
            image (str | PathLike | np.ndarray): a file, or a BGR uint8
                array (as ``mmcv.imread`` returns).

        Returns:
            tuple: ``(input (1, 3, H, W) float32, (h_scale, w_scale),
            (orig_h, orig_w))``.
        """
        import mmcv
        if isinstance(image, (str, os.PathLike)):
            path = os.fspath(image)
            array = mmcv.imread(path)
            if array is None:
                raise ValueError(f'cannot read image {path}')
        else:
            array = np.asarray(image)
        if array.ndim != 3 or array.shape[2] != 3:
            raise ValueError(f'an image must be H x W x 3, got '
                             f'{tuple(array.shape)}')
        if array.size == 0:
            raise ValueError(f'an image must not be empty, got '
                             f'{tuple(array.shape)}')
        if array.dtype.kind not in 'biuf':
            raise ValueError('an image must be an array of numbers, got '
                             f'dtype {array.dtype}')
        # a NaN pixel would give no detections, not an error
        check_finite_array(array, 'the image')
        height, width = self.meta['input_shape']
        orig_h, orig_w = array.shape[:2]
        resized = mmcv.imresize(array, (width, height)).astype(np.float32)
        if self.meta.get('bgr_to_rgb'):
            resized = resized[..., ::-1]
        if self.meta.get('mean') is not None:
            resized = (resized - np.asarray(self.meta['mean'], np.float32)) \
                / np.asarray(self.meta['std'], np.float32)
        tensor = np.ascontiguousarray(resized.transpose(2, 0, 1)[None])
        return tensor.astype(np.float32), (height / orig_h,
                                           width / orig_w), (orig_h, orig_w)

    def run_input(self,
                  tensor: np.ndarray,
                  prior: Optional[np.ndarray] = None,
                  support: Optional[Tuple[Any, Any]] = None) -> tuple:
        """The graph's raw outputs for an input tensor and a prior.

        The prior gets the checks of :meth:`resolve_prior` (shape, NaN,
        range, folded graph), and the input must be a finite (1, 3, H, W)
        array of the graph's size: what the session would turn into NaN
        scores is refused first.

        Args:
            tensor (np.ndarray): the input (:meth:`preprocess`).
            prior: see :meth:`resolve_prior`.
            support (tuple, optional): a graph with a support input: the
                prior's (support, class shares), (K,) each; default
                :meth:`resolve_support` of ``prior``.

        Returns:
            tuple[np.ndarray, np.ndarray]: ``dets`` (N, 5) and ``labels``.

        Raises:
            ValueError: a bad prior or input, in one line.
        """
        tensor = np.asarray(tensor)
        shape = (1, 3, *self.meta['input_shape'])
        if tuple(tensor.shape) != shape:
            raise ValueError(f'the input must have the shape {shape}, got '
                             f'{tuple(tensor.shape)}')
        check_finite_array(tensor, 'the input tensor')
        matrix, recorded = self.resolve(prior)
        if support is None:
            support = recorded
        elif self.support_input:
            support = self._check_support(support)
        return self._run(tensor.astype(np.float32, copy=False), matrix,
                         support)

    def _check_support(self, support: Tuple[Any, Any]) -> tuple:
        """A given (support, class shares): (K,) each, finite, n >= 0 and
        shares in [0, 1]."""
        if not isinstance(support, (tuple, list)) or len(support) != 2:
            raise ValueError('the support must be a pair (support, class '
                             'shares), (K,) each, got a '
                             f'{type(support).__name__}' + (
                                 f' of {len(support)} items' if isinstance(
                                     support, (tuple, list)) else ''))
        out = []
        for name, value in zip(('support', 'class shares'), support):
            value = np.asarray(value, dtype=np.float32)
            if value.shape != (self.num_classes, ):
                raise ValueError(f'the {name} must have shape '
                                 f'({self.num_classes},), got {value.shape}')
            check_finite_array(value, f'the {name}')
            if (value < 0).any():
                raise ValueError(f'the {name} must be >= 0')
            out.append(value)
        if (out[1] > 1).any():
            raise ValueError('the class shares must lie in [0, 1]')
        return tuple(out)

    def _run(self,
             tensor: np.ndarray,
             prior: Optional[np.ndarray],
             support: Optional[tuple] = None) -> tuple:
        """:meth:`run_input` on a checked input and resolved prior (and
        support: ``None`` feeds zeros, no support)."""
        outputs = self.run_graph(tensor, prior, support)
        if self.meta.get('head') == 'roi':  # a two-stage detector's
            return roi_detections(*outputs, self.meta['postprocess'])
        if self.meta.get('postprocess'):  # a one-stage detector's
            return dense_detections(
                outputs[0],
                outputs[1],
                self.meta['level_sizes'],
                self.meta['postprocess'],
                score_factors=outputs[2] if len(outputs) > 2 else None)
        return tuple(outputs)

    def run_graph(self,
                  tensor: np.ndarray,
                  prior: Optional[np.ndarray] = None,
                  support: Optional[tuple] = None) -> list:
        """The graph's outputs as ONNX Runtime gives them, before the
        runtime's post-processing (a one- or two-stage graph's boxes and
        scores), for a checked input and a resolved prior (:meth:`resolve`;
        ``None`` feeds the stored one, no support zeros)."""
        feeds = {'input': tensor}
        if self.prior_input:
            feeds['prior'] = self.default_prior if prior is None else prior
        if self.support_input:
            zeros = np.zeros(self.num_classes, dtype=np.float32)
            feeds['prior_support'], feeds['prior_marginals'] = \
                support if support is not None else (zeros, zeros)
        return self.session.run(None, feeds)

    def __call__(self,
                 images: Union[ImageLike, Sequence[ImageLike]],
                 prior: Any = None,
                 score_thr: float = 0.0) -> Union[Dict, List[Dict]]:
        """Detect objects under a prior.

        Args:
            images: an image (file or BGR array) or a list of them.
            prior: see :meth:`resolve_prior`; checked before anything runs.
            score_thr (float): keep detections scoring at least this.

        Returns:
            dict | list[dict]: per image ``bboxes`` (N, 4: x1, y1, x2, y2
            in the original image's pixels), ``scores``, ``labels`` and
            ``label_names`` (when the classes are known), best first.
        """
        check_float('score_thr', score_thr, 0, 1)
        matrix, support = self.resolve(prior)
        single = isinstance(images, (str, os.PathLike, np.ndarray))
        results = []
        for image in ([images] if single else list(images)):
            tensor, (h_scale, w_scale), (orig_h, orig_w) = \
                self.preprocess(image)
            dets, labels = self._run(tensor, matrix, support)
            boxes = dets[:, :4] / np.array(
                [w_scale, h_scale, w_scale, h_scale], np.float32)
            boxes[:, 0::2] = boxes[:, 0::2].clip(0, orig_w)
            boxes[:, 1::2] = boxes[:, 1::2].clip(0, orig_h)
            keep = dets[:, 4] >= score_thr
            result = dict(
                bboxes=boxes[keep],
                scores=dets[keep, 4],
                labels=labels[keep].astype(np.int64))
            if self.classes:
                result['label_names'] = [
                    self.classes[int(k)] for k in result['labels']
                ]
            results.append(result)
        return results[0] if single else results

    @staticmethod
    def to_json(result: Dict) -> Dict:
        """A result as JSON-ready lists."""
        return {
            key: value.tolist() if isinstance(value, np.ndarray) else value
            for key, value in result.items()
        }
