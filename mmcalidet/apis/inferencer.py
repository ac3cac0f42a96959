# Copyright (c) mmcalidet contributors. All rights reserved.
"""``CaliDetInferencer``: mmdet's ``DetInferencer`` with a prior."""
import copy
import os.path as osp
from typing import Any, List, Optional, Sequence, Tuple

import mmcv
import numpy as np
from mmdet.apis import DetInferencer
from mmdet.apis.det_inferencer import InputsType
from mmdet.structures import DetDataSample
from torch import nn

from ..utils.checkpoint import build_with_checked_checkpoint
from ..utils.validation import check_device, check_float
from .inference import (attach_call_prior, call_prior_fields, is_calibratable,
                        per_image_priors, resolve_call_priors)
from .prior_comparison import (count_by_class, describe_changes, prior_changes,
                               threshold_text)


def fit_text(text: str,
             width: int,
             font_size: int,
             dpi: float = 100.0,
             min_font_size: int = 8) -> Tuple[int, str]:
    """A font size (and, if even the smallest is too wide, a shortened
    text) so that one line fits ``width`` pixels.

    Args:
        text (str): the line.
        width (int): the room in pixels.
        font_size (int): the preferred size, in points.
        dpi (float): pixels per inch of the figure that draws the text.
        min_font_size (int): the smallest size to use.

    Returns:
        tuple[int, str]: the font size and the text.
    """
    # pixels per character and point: at most 0.62 em (DejaVu Sans)
    char_width = 0.62 * dpi / 72
    fits = int(width / (char_width * max(len(text), 1)))
    if fits >= min_font_size:
        return min(font_size, fits), text
    max_chars = max(int(width / (char_width * min_font_size)), 4)
    return min_font_size, text[:max_chars - 3] + '...'


def draw_comparison(visualizer, img: np.ndarray, name: str,
                    preds: Sequence[DetDataSample], titles: Sequence[str],
                    footer: str, score_thr: float) -> np.ndarray:
    """Two panels drawn by the visualizer, each under a title, and a
    footer line that names what changed.

    Args:
        visualizer (DetLocalVisualizer): draws the detections.
        img (np.ndarray): the RGB image.
        name (str): its name.
        preds (Sequence[DetDataSample]): the two predictions.
        titles (Sequence[str]): the two panel titles.
        footer (str): the line under the panels.
        score_thr (float): draw and count detections at or above this.

    Returns:
        np.ndarray: the RGB canvas.
    """
    height, width = img.shape[:2]
    strip = max(22, int(round(0.06 * height)))
    gap = max(4, width // 100)
    panels = []
    for pred in preds:
        visualizer.add_datasample(
            name,
            img,
            pred,
            show=False,
            draw_gt=False,
            pred_score_thr=score_thr)
        panels.append(visualizer.get_image())
    canvas = np.full((height + 2 * strip, 2 * width + gap, 3),
                     255,
                     dtype=np.uint8)
    for k, panel in enumerate(panels):
        x = k * (width + gap)
        canvas[strip:strip + height, x:x + width] = panel
    texts, positions, widths = [], [], []
    for k, (title, pred) in enumerate(zip(titles, preds)):
        count = sum(count_by_class(pred, score_thr).values())
        texts.append(f'{title}: {count} detections >= '
                     f'{threshold_text(score_thr)}')
        positions.append([k * (width + gap) + 4, strip // 2])
        widths.append(width - 8)
    texts.append(footer)
    positions.append([4, height + strip + strip // 2])
    widths.append(canvas.shape[1] - 8)
    font_sizes = []
    for k, (text, room) in enumerate(zip(texts, widths)):
        size, text = fit_text(text, room, int(strip * 0.4), visualizer.dpi)
        texts[k] = text
        font_sizes.append(size)
    visualizer.set_image(canvas)
    visualizer.draw_texts(
        texts,
        np.array(positions),
        colors='black',
        font_sizes=font_sizes,
        vertical_alignments='center')
    return visualizer.get_image()


class CaliDetInferencer(DetInferencer):
    """mmdet's ``DetInferencer`` for CaliDet detectors: every call takes a
    ``prior``.

    ``inferencer(img, prior='site.json', out_dir='outputs')`` runs with
    that prior for this call only (the model's prior is not changed);
    without ``prior`` the model's deployment prior applies (the
    checkpoint's, or ``prior`` given here at construction).

    Args:
        model, weights, device, scope, palette, show_progress: as mmdet's
            ``DetInferencer``.
        prior (optional): a deployment prior to set after loading (a prior
            file, a shipped name, a dict or a K x K matrix); ``None`` keeps
            the checkpoint's.
    """

    preprocess_kwargs: set = DetInferencer.preprocess_kwargs | {'priors'}

    def __init__(self,
                 model=None,
                 weights: Optional[str] = None,
                 device: Optional[str] = None,
                 scope: Optional[str] = 'mmdet',
                 palette: str = 'none',
                 show_progress: bool = True,
                 prior: Any = None) -> None:
        check_device(device)
        super().__init__(
            model=model,
            weights=weights,
            device=device,
            scope=scope,
            palette=palette,
            show_progress=show_progress)
        if prior is not None:
            self._check_calibratable()
            self.model.set_prior(prior)

    def _init_model(self, cfg, weights: Optional[str], device: str = 'cpu'):
        """mmdet's model loading, then the checks of ``tools/test.py``: a
        checkpoint that does not fit (another class count, a plain
        detector's in a CaliDet model, missing tensors), has an invalid
        prior or cannot be read is a :class:`CheckpointError` naming the
        file (mmdet only logs the tensors that do not fit)."""

        def build(checkpoint: Optional[str], contents=None) -> nn.Module:
            # a copy each time: mmdet's builder edits the config
            return super(CaliDetInferencer, self)._init_model(
                copy.deepcopy(cfg), checkpoint, device)

        return build_with_checked_checkpoint(build, weights)

    def _check_calibratable(self) -> None:
        if not is_calibratable(self.model):
            raise ValueError('a prior needs a calibratable detector '
                             '(CaliDet, e.g. CaliDINO), got '
                             f'{type(self.model).__name__}')

    def _resolve(self, inputs: InputsType,
                 prior: Any) -> Tuple[list, Optional[list]]:
        """The inputs as a list and their validated priors' data sample
        fields (:func:`call_prior_fields`; ``None`` items: the model's
        prior); ``None`` for all: the model's prior."""
        if prior is None:
            return self._inputs_to_list(inputs), None
        self._check_calibratable()
        if isinstance(inputs, str) and osp.isdir(inputs) and \
                per_image_priors(prior) is not None:
            raise ValueError('per-image priors need a list of images, not a '
                             f'folder ({inputs})')
        inputs = self._inputs_to_list(inputs)
        return inputs, call_prior_fields(
            self.model, resolve_call_priors(self.model, prior, len(inputs)))

    def __call__(self,
                 inputs: InputsType,
                 *args,
                 prior: Any = None,
                 **kwargs) -> dict:
        """Call the inferencer, under a prior.

        Args:
            inputs (str | ndarray | list): images, or a folder of images.
            *args: as ``DetInferencer.__call__`` (``batch_size``, ...).
            prior (optional): the prior of this call: a prior file, a
                shipped name, a dict, a K x K matrix, or one per image (a
                list or a (B, K, K) array; ``None`` items use the model's
                prior). Validated before the model runs. ``None`` uses the
                model's prior.
            **kwargs: as ``DetInferencer.__call__`` (``out_dir``,
                ``pred_score_thr``, ``return_datasamples``, ...).

        Returns:
            dict: ``predictions`` and ``visualization``, as mmdet's.
        """
        inputs, priors = self._resolve(inputs, prior)
        if priors is not None:
            kwargs['priors'] = priors
        return super().__call__(inputs, *args, **kwargs)

    def preprocess(self,
                   inputs: InputsType,
                   batch_size: int = 1,
                   priors: Optional[List[Any]] = None,
                   **kwargs):
        """``DetInferencer.preprocess``, then each image's prior into its
        data sample (``data_sample.prior``), which overrides the model's
        prior for that image.

        Args:
            inputs (list): the inputs.
            batch_size (int): batch size.
            priors (list[dict], optional): one item per input, the fields
                of :func:`call_prior_fields` (``None``: the model's
                prior).

        Yields:
            tuple: ``(original inputs, collated data)`` per batch.
        """
        batches = super().preprocess(inputs, batch_size, **kwargs)
        if priors is None:
            yield from batches
            return
        remaining = iter(priors)
        for ori_inputs, data in batches:
            for sample in data['data_samples']:
                attach_call_prior(sample, next(remaining))
            yield ori_inputs, data

    def compare_priors(self,
                       inputs: InputsType,
                       prior: Any,
                       other_prior: Any,
                       titles: Optional[Sequence[str]] = None,
                       pred_score_thr: float = 0.3,
                       batch_size: int = 1,
                       out_dir: str = '') -> dict:
        """Detect the same images under two priors and draw the results
        side by side.

        The boxes do not depend on the prior (only the classification
        does), so the two panels show how the prior re-scores and
        re-labels the same candidate boxes. Both priors are validated
        before the model runs.

        Args:
            inputs (str | ndarray | list): images, or a folder of images.
            prior: the first prior (left panel); ``None`` is the model's.
            other_prior: the second prior (right panel); ``None`` is the
                model's.
            titles (Sequence[str], optional): the two panel titles.
                Defaults to ``('prior A', 'prior B')``.
            pred_score_thr (float): draw and count detections at or above
                this score. Defaults to 0.3.
            batch_size (int): inference batch size.
            out_dir (str): if given, write ``out_dir/compare/<name>.png``.

        Returns:
            dict: ``inputs`` (the list of inputs, a folder expanded),
            ``predictions`` (a ``(first, second)`` pair of DetDataSample
            per input), ``visualization`` (the side-by-side RGB images),
            ``changes`` (:func:`prior_changes` per input: the detections
            matched by label and box, their scores compared) and ``files``
            (the images written).
        """
        check_float('pred_score_thr', pred_score_thr, 0, 1)
        titles = list(titles) if titles is not None else ['prior A', 'prior B']
        inputs, first = self._resolve(inputs, prior)
        _, second = self._resolve(inputs, other_prior)
        preds = []
        for priors in (first, second):
            kwargs = dict(priors=priors) if priors is not None else {}
            preds.append(super().__call__(
                inputs,
                batch_size=batch_size,
                return_datasamples=True,
                no_save_vis=True,
                **kwargs)['predictions'])
        classes = self.model.dataset_meta['classes']
        results = dict(
            inputs=inputs,
            predictions=[],
            visualization=[],
            changes=[],
            files=[])
        for index, (single_input, pred,
                    other) in enumerate(zip(inputs, *preds)):
            img, name = self._load_for_drawing(single_input, index)
            changes = prior_changes(pred, other, classes, pred_score_thr)
            compared = sum(count_by_class(pred, pred_score_thr).values())
            canvas = self._draw_comparison(
                img, name, (pred, other), titles,
                describe_changes(changes, pred_score_thr, compared),
                pred_score_thr)
            results['predictions'].append((pred, other))
            results['visualization'].append(canvas)
            results['changes'].append(changes)
            if out_dir:
                out_file = osp.join(out_dir, 'compare',
                                    osp.splitext(name)[0] + '.png')
                mmcv.imwrite(canvas[..., ::-1], out_file)
                results['files'].append(out_file)
        return results

    @staticmethod
    def _load_for_drawing(single_input: Any,
                          index: int) -> Tuple[np.ndarray, str]:
        """The RGB image and a file name for an input."""
        if isinstance(single_input, dict):  # inputs with text prompts
            single_input = single_input.get('img',
                                            single_input.get('img_path'))
        if isinstance(single_input, str):
            return mmcv.imread(single_input, channel_order='rgb'), \
                osp.basename(single_input)
        if isinstance(single_input, np.ndarray):  # BGR, as mmcv loads it
            return mmcv.bgr2rgb(single_input), f'{index:08d}.png'
        raise ValueError(f'unsupported input type: {type(single_input)}')

    def _draw_comparison(self, img: np.ndarray, name: str,
                         preds: Sequence[DetDataSample], titles: Sequence[str],
                         footer: str, score_thr: float) -> np.ndarray:
        """:func:`draw_comparison` with this inferencer's visualizer."""
        return draw_comparison(self.visualizer, img, name, preds, titles,
                               footer, score_thr)
