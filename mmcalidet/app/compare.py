# Copyright (c) mmcalidet contributors. All rights reserved.
"""What a prior changed in one image: the detections matched by box, and
the two panels drawn by mmdet's visualizer.

A prior reaches only the classification of a DETR-family detector: under
two priors the decoder predicts the same boxes, and each box's classes
and scores move. So detections are matched by their box (to
:data:`BOX_DECIMALS` pixel decimals): a box's best class and score under
each prior, and the change between them.
"""
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

#: boxes equal to this many decimals of a pixel are the same candidate
BOX_DECIMALS = 2
#: the columns of :func:`changed_detections`' rows
CHANGE_COLUMNS = ('box (x1, y1, x2, y2)', 'class under E_t', 'score under E_t',
                  'class under the prior', 'score under the prior', 'change')


def _best_per_box(pred) -> Dict[Tuple[float, ...], Tuple[int, float]]:
    """Each box's highest-scoring (label, score)."""
    inst = pred.pred_instances
    boxes = inst.bboxes.cpu().numpy().astype(np.float64).round(BOX_DECIMALS)
    scores = inst.scores.cpu().numpy().astype(np.float64)
    labels = inst.labels.cpu().numpy().astype(int)
    best: Dict[Tuple[float, ...], Tuple[int, float]] = {}
    for box, label, score in zip(boxes, labels, scores):
        key = tuple(float(v) for v in box)
        if key not in best or score > best[key][1]:
            best[key] = (int(label), float(score))
    return best


def changed_detections(pred,
                       other,
                       classes: Sequence[str],
                       score_thr: float,
                       top: int = 10) -> List[List]:
    """The detections whose class or score changed most between two
    predictions of one image (e.g. under E_t and under a site prior).

    Args:
        pred (DetDataSample): the first prediction (E_t).
        other (DetDataSample): the second one (the chosen prior).
        classes (Sequence[str]): the class names.
        score_thr (float): only boxes at or above it under either prior.
        top (int): the most rows.

    Returns:
        list[list]: rows of :data:`CHANGE_COLUMNS`, a changed class first,
        then the largest score change; a box that one prediction does not
        keep scores ``None`` there (below that prediction's top k).
    """
    first, second = _best_per_box(pred), _best_per_box(other)
    rows = []
    for box in set(first) | set(second):
        a, b = first.get(box), second.get(box)
        if max(a[1] if a else 0.0, b[1] if b else 0.0) < score_thr:
            continue
        same_class = a is not None and b is not None and a[0] == b[0]
        change = (b[1] if b else 0.0) - (a[1] if a else 0.0)
        if same_class and change == 0:
            continue
        rows.append((not same_class, abs(change), [
            ', '.join(f'{v:.0f}' for v in box), classes[a[0]] if a else '-',
            round(a[1], 4) if a else None, classes[b[0]] if b else '-',
            round(b[1], 4) if b else None,
            float(f'{change:.3g}')
        ]))
    rows.sort(key=lambda r: (-r[0], -r[1]))
    return [row for _, _, row in rows[:top]]


def count_above(pred, score_thr: float) -> int:
    """The detections at or above ``score_thr``."""
    return int((pred.pred_instances.scores >= score_thr).sum())


class PanelDrawer:
    """Draws a prediction over its image with mmdet's visualizer (the
    model config's ``visualizer``, as ``DetInferencer`` builds it).

    Args:
        model (nn.Module): the detector (its ``cfg`` and ``dataset_meta``).
    """

    def __init__(self, model) -> None:
        from mmdet.registry import VISUALIZERS
        from mmengine.config import ConfigDict
        cfg = ConfigDict(
            model.cfg.get('visualizer', dict(type='mmdet.DetLocalVisualizer')))
        # a name of its own: the visualizers are process-wide instances
        cfg.name = f'prior_app_{id(self)}_{time.time_ns()}'
        cfg.pop('vis_backends', None)  # draws only, never writes
        self.visualizer = VISUALIZERS.build(cfg)
        self.visualizer.dataset_meta = model.dataset_meta
        self._lock = threading.Lock()  # the visualizer holds its image

    def draw(self,
             img: np.ndarray,
             pred,
             score_thr: float,
             name: str = 'image') -> np.ndarray:
        """The RGB image with the detections at or above ``score_thr``.

        Args:
            img (np.ndarray): H x W x 3 RGB.
            pred (DetDataSample): its prediction.
            score_thr (float): the score threshold.
            name (str): the image's name.

        Returns:
            np.ndarray: the drawn RGB image.
        """
        with self._lock:
            self.visualizer.add_datasample(
                name,
                img,
                pred,
                show=False,
                draw_gt=False,
                pred_score_thr=score_thr)
            return self.visualizer.get_image()


def panel_titles(prior_name: str,
                 preds: Sequence,
                 score_thr: float,
                 train_name: Optional[str] = 'E_t') -> List[str]:
    """The two panels' labels: each prior and its number of detections."""
    return [
        f'{name}: {count_above(p, score_thr)} detections >= {score_thr:.2f}'
        for name, p in zip((train_name, prior_name), preds)
    ]
