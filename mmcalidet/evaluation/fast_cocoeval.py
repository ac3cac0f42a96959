# Copyright (c) mmcalidet contributors. All rights reserved.
"""pycocotools' box ``COCOeval.evaluate`` with the per-image matching in
numpy.

:class:`FastCOCOeval` takes the detections as the N x 7 array
``COCO.loadRes`` takes (image id, x, y, w, h, score, category id) and
fills ``evalImgs`` with the same entries as pycocotools' ``evaluateImg``
(the same greedy matching, ties and crowd / ignored ground truth included),
so ``accumulate`` and ``summarize`` (pycocotools' own) give the same
figures to the bit. What it saves: ``loadRes``'s annotation dicts, the
IoU per (image, category) call and ``evaluateImg``'s loops over IoU
thresholds, detections and ground truths. The matching runs all images,
categories, area ranges and thresholds at once, one step per detection
rank, over the detections that overlap some ground truth at the lowest
threshold (the others match nothing and change no state).
The arrays and the matching are :mod:`.coco_matches`';
``tests/test_evaluation/test_fast_cocoeval.py`` compares them with
pycocotools entry by entry.
"""
import copy
import datetime
from typing import Dict, List, Optional

import numpy as np
from pycocotools.cocoeval import COCOeval

from .coco_matches import GroundTruthTable, Matches


class FastCOCOeval(COCOeval):
    """Box ``COCOeval`` of a detection array, ``evaluate`` in numpy.

    Set ``params`` as for ``COCOeval`` (``imgIds``, ``catIds``,
    ``areaRng``, ``maxDets``, ``iouThrs``); ``accumulate`` and
    ``summarize`` are pycocotools'. Only box IoU with categories
    (``iouType='bbox'``, ``useCats=1``) is supported. ``ious`` is not
    filled.

    Args:
        coco_gt: the ground truth (a loaded ``COCO``).
        dets (np.ndarray): N x 7 detections as ``COCO.loadRes`` takes them:
            image id, x, y, w, h, score, category id (detection ``i`` gets
            the id ``i + 1``, as ``loadRes`` gives it).
        gt_table (GroundTruthTable, optional): ``coco_gt`` as arrays (built
            when not given; pass one to share it across evaluations).
    """

    def __init__(self,
                 coco_gt,
                 dets: np.ndarray,
                 gt_table: Optional[GroundTruthTable] = None) -> None:
        self._eval_imgs = None
        self._matches: Optional[Matches] = None
        super().__init__(coco_gt, None, 'bbox')
        dets = np.asarray(dets, np.float64)
        if dets.ndim != 2 or dets.shape[1] != 7:
            raise ValueError('dets must be an N x 7 array (image id, x, y, '
                             f'w, h, score, category id), got shape '
                             f'{dets.shape}')
        self.gt_table = gt_table or GroundTruthTable(coco_gt)
        unknown = set(dets[:, 0].astype(np.int64).tolist()) - \
            self.gt_table.img_ids
        if unknown:
            raise ValueError(f'detections of image {sorted(unknown)[0]!r}, '
                             'which the ground truth does not hold')
        self.dets = dets

    @property
    def matches(self) -> Optional['Matches']:
        """The matches of the last ``evaluate`` as arrays (``None``
        before it, or after ``evalImgs`` was set)."""
        return self._matches

    @property
    def evalImgs(self) -> List[Optional[Dict]]:  # noqa: N802 (COCOeval's)
        """pycocotools' ``evalImgs``, built from the matches when first
        read (``accumulate`` does not need them)."""
        if self._eval_imgs is None and self._matches is not None:
            self._eval_imgs = self._matches.eval_imgs()
        return self._eval_imgs

    @evalImgs.setter
    def evalImgs(self, value) -> None:  # noqa: N802
        self._eval_imgs = value
        self._matches = None

    def evaluate(self) -> None:
        """Match the detections (``evalImgs``, in pycocotools' category,
        area range, image order) and set ``_paramsEval``."""
        p = self.params
        if p.useSegm is not None or p.iouType != 'bbox' or not p.useCats:
            raise ValueError('FastCOCOeval evaluates boxes per category only '
                             "(iouType 'bbox', useCats 1)")
        p.imgIds = list(np.unique(p.imgIds))
        p.catIds = list(np.unique(p.catIds))
        p.maxDets = sorted(p.maxDets)
        self.params = p
        self.ious = {}
        matches = Matches(self.gt_table, self.dets, p.imgIds, p.catIds,
                          p.areaRng, p.maxDets[-1], p.iouThrs)
        self.evalImgs = None
        self._matches = matches
        self._paramsEval = copy.deepcopy(self.params)

    def accumulate(self, p=None) -> None:
        """pycocotools' ``accumulate`` (``eval``: precision, recall,
        scores), from the matches' arrays with the same operations; with
        other ``p`` than the evaluated parameters, pycocotools' own."""
        params = self.params if p is None else p
        pe = getattr(self, '_paramsEval', None)
        if self._matches is None or pe is None or any(
                list(getattr(params, k)) != list(getattr(pe, k))
                for k in ('imgIds', 'catIds', 'maxDets')) or [
                    list(r) for r in params.areaRng
                ] != [list(r) for r in pe.areaRng
                      ] or not np.array_equal(params.iouThrs, pe.iouThrs):
            return super().accumulate(p)
        precision, recall, scores = self._matches.accumulate(
            np.asarray(params.recThrs), list(params.maxDets))
        self.eval = {
            'params': params,
            'counts': list(precision.shape),
            'date': datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S'),
            'precision': precision,
            'recall': recall,
            'scores': scores,
        }
