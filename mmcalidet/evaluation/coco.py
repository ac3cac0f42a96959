# Copyright (c) mmcalidet contributors. All rights reserved.
"""COCO box metrics of detections, on any subset of the images.

The same COCOeval set-up as mmdet's ``CocoMetric`` (``maxDets`` 100 / 300
/ 1000, default IoU thresholds, categories of the model's classes), without
its JSON round trip and its rounding to three decimals, so that many small
evaluations (subsets, self-calibration iterations) are cheap and their
averages keep their precision. ``tests/test_evaluation`` checks that the
figures equal ``CocoMetric``'s up to that rounding. The matching runs in
numpy (:class:`~mmcalidet.evaluation.fast_cocoeval.FastCOCOeval`: the same
``evalImgs`` and precisions as pycocotools' to the bit). The per-image
matches, from which the AP of any multiset of the images follows, are
:mod:`.image_matches`'; the paired bootstrap over them is
:mod:`.bootstrap`'.
"""
import contextlib
import io
import numbers
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from mmengine.structures import InstanceData

from .coco_matches import GroundTruthTable
from .fast_cocoeval import FastCOCOeval
from .image_matches import ImageMatches

#: the six standard COCO box metrics, in COCOeval's ``stats`` order
METRICS = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl')


class CocoEvaluator:
    """COCO box AP of per-image detections.

    Args:
        ann_file (str | COCO): the COCO annotation file (or a loaded
            ``COCO`` object, e.g. a ``CocoMetric``'s ``_coco_api``).
        classes (Sequence[str]): the model's class names; category ids are
            looked up by name as ``CocoMetric`` does.
        proposal_nums (Sequence[int]): COCOeval ``maxDets``.
    """

    def __init__(
        self,
        ann_file,
        classes: Sequence[str],
        proposal_nums: Sequence[int] = (100, 300, 1000)
    ) -> None:
        from mmdet.datasets.api_wrappers import COCO
        if isinstance(ann_file, str):
            with contextlib.redirect_stdout(io.StringIO()):
                self.coco = COCO(ann_file)
        else:
            self.coco = ann_file
        self.classes = list(classes)
        self.cat_ids = self.coco.get_cat_ids(cat_names=self.classes)
        if len(self.cat_ids) != len(self.classes):
            raise ValueError(
                f'the annotation file has {len(self.cat_ids)} of the '
                f'{len(self.classes)} classes of the model')
        self.proposal_nums = list(proposal_nums)
        self.all_img_ids = list(self.coco.get_img_ids())
        # COCOeval reads every box's area: name the one without it
        for ann in self.coco.dataset.get('annotations', []):
            if not isinstance(ann.get('area'), numbers.Real):
                where = f'{ann_file}: ' if isinstance(ann_file, str) else ''
                raise ValueError(
                    f'{where}annotation {ann.get("id")!r} of image '
                    f'{ann.get("image_id")!r} has no numeric "area" (COCO '
                    'box metrics need one per box)')
        # (category id, area) of each ground truth box, per image, and the
        # categories with ground truth, per image
        self._img_areas = {
            img_id: [(ann['category_id'], ann['area'])
                     for ann in self.coco.imgToAnns.get(img_id, [])]
            for img_id in self.all_img_ids
        }
        self._img_cats = {
            img_id: {cat
                     for cat, _ in boxes}
            for img_id, boxes in self._img_areas.items()
        }
        # (images, detection objects) -> metrics, while remembering
        self._memo: Optional[Dict] = None
        # the ground truth as arrays, for FastCOCOeval (built on first use)
        self._gt_arrays: Optional[GroundTruthTable] = None

    def remember(self, enabled: bool = True) -> None:
        """Keep the metrics of every evaluation from now on and give them
        back when the same detection objects (e.g. a
        :class:`~mmcalidet.evaluation.Rescorer`'s remembered predictions)
        are evaluated on the same images again: a (prior, image set)
        several tables score is evaluated once. The detections must not
        change meanwhile. ``False`` forgets them and stops.

        Args:
            enabled (bool): remember (``True``) or forget (``False``).
        """
        self._memo = {} if enabled else None

    def _gt_table(self) -> GroundTruthTable:
        """The ground truth as arrays (built on first use)."""
        if self._gt_arrays is None:
            self._gt_arrays = GroundTruthTable(self.coco)
        return self._gt_arrays

    def _memo_key(self, img_ids, results, eval_img_ids) -> Optional[tuple]:
        if self._memo is None:
            return None
        return (tuple(int(i) for i in img_ids),
                None if eval_img_ids is None else tuple(
                    int(i)
                    for i in eval_img_ids), tuple(id(r) for r in results))

    def area_ranges(self, img_ids: Sequence[int], cat_ids: Sequence[int],
                    params) -> List[int]:
        """The area ranges of ``params`` (COCOeval's ``all``, ``small``,
        ``medium``, ``large``) worth evaluating on these images and
        categories: ``all``, and each other range that holds a ground-truth
        area. A range without one scores -1 in every metric, evaluated or
        not (``summarize`` gives -1 for a range it does not find), so
        leaving it out changes no figure and saves its share of COCOeval's
        per-image work (two ranges of four where every object is small).

        Args:
            img_ids (Sequence[int]): the evaluated images.
            cat_ids (Sequence[int]): the evaluated category ids.
            params: a ``COCOeval.params`` (``areaRng``, ``areaRngLbl``).

        Returns:
            list[int]: indices into ``params.areaRng``.
        """
        cats = set(cat_ids)
        areas = [
            area for img_id in img_ids for cat, area in self._img_areas[img_id]
            if cat in cats
        ]
        areas = np.asarray(areas, dtype=np.float64)
        keep = []
        for i, label in enumerate(params.areaRngLbl):
            lo, hi = params.areaRng[i]
            if label == 'all' or ((areas >= lo) & (areas <= hi)).any():
                keep.append(i)
        return keep

    def to_array(self, img_ids: Sequence[int],
                 results: Sequence[InstanceData]) -> np.ndarray:
        """Detections as the N x 7 array ``loadRes`` takes: image id, x, y,
        w, h, score, category id."""
        rows = []
        cat_ids = np.asarray(self.cat_ids)
        for img_id, res in zip(img_ids, results):
            n = len(res.scores)
            if n == 0:
                continue
            boxes = np.asarray(
                res.bboxes.cpu().numpy()
                if hasattr(res.bboxes, 'cpu') else res.bboxes,
                dtype=np.float64)
            boxes = boxes.reshape(-1, 4)
            arr = np.empty((n, 7))
            arr[:, 0] = img_id
            arr[:, 1:3] = boxes[:, :2]
            arr[:, 3:5] = boxes[:, 2:] - boxes[:, :2]
            arr[:, 5] = np.asarray(
                res.scores.cpu().numpy()
                if hasattr(res.scores, 'cpu') else res.scores,
                dtype=np.float64)
            labels = np.asarray(
                res.labels.cpu().numpy()
                if hasattr(res.labels, 'cpu') else res.labels,
                dtype=np.int64)
            arr[:, 6] = cat_ids[labels]
            rows.append(arr)
        return np.concatenate(rows) if rows else np.zeros((0, 7))

    def _cocoeval(self,
                  img_ids: Sequence[int],
                  results: Sequence[InstanceData],
                  eval_img_ids: Optional[Sequence[int]] = None,
                  all_area_only: bool = False,
                  max_dets: Optional[Sequence[int]] = None):
        """COCOeval set up on these detections and run to ``evaluate()``
        (the per-image matching), or ``None`` when no evaluated image has
        ground truth.

        Args:
            img_ids (Sequence[int]): the COCO image id of each result.
            results (Sequence[InstanceData]): detections per image.
            eval_img_ids (Sequence[int], optional): the images to evaluate
                on; default ``img_ids``.
            all_area_only (bool): only the area range ``all`` and the
                first ``maxDets`` (what :class:`ImageMatches` reads);
                else every range with ground truth and every ``maxDets``.
            max_dets (Sequence[int], optional): with ``all_area_only``,
                the ``maxDets`` (default the first).

        Returns:
            COCOeval | None: the evaluation.
        """
        if len(img_ids) != len(results):
            raise ValueError(f'{len(img_ids)} image ids for {len(results)} '
                             'results')
        eval_img_ids = list(img_ids if eval_img_ids is None else eval_img_ids)
        unknown = (set(eval_img_ids) | set(img_ids)) - set(self.coco.imgs)
        if unknown:
            raise ValueError(f'image id {sorted(unknown)[0]!r} is not in the '
                             'annotation file')
        # COCOeval leaves a category without ground truth in the evaluated
        # images out of every mean (its precision stays -1), and applies
        # maxDets per image and category: evaluating only the categories
        # with ground truth gives the same figures, much faster on subsets
        with_gt = set().union(*(self._img_cats[i] for i in eval_img_ids)) \
            if eval_img_ids else set()
        cat_ids = [c for c in self.cat_ids if c in with_gt]
        if not cat_ids:
            return None
        dets = self.to_array(img_ids, results)
        in_eval = set(eval_img_ids)
        dets = dets[np.isin(dets[:, 6], cat_ids)
                    & np.isin(dets[:, 0], list(in_eval))]
        if len(dets) == 0:
            # loadRes needs one detection: a zero-score false positive
            # changes nothing when there is no true positive (AP 0)
            dets = np.array([[eval_img_ids[0], 0, 0, 1, 1, 0, cat_ids[0]]],
                            dtype=np.float64)
        with contextlib.redirect_stdout(io.StringIO()):
            # pycocotools' COCOeval with its per-image matching in numpy,
            # on the array loadRes would take: the same evalImgs
            coco_eval = FastCOCOeval(self.coco, dets, self._gt_table())
            params = coco_eval.params
            params.catIds = cat_ids
            params.imgIds = eval_img_ids
            if all_area_only:
                params.maxDets = list(max_dets or self.proposal_nums[:1])
                keep = [0]  # 'all'
            else:
                params.maxDets = self.proposal_nums
                keep = self.area_ranges(eval_img_ids, cat_ids, params)
            params.areaRng = [params.areaRng[i] for i in keep]
            params.areaRngLbl = [params.areaRngLbl[i] for i in keep]
            coco_eval.evaluate()
        return coco_eval

    def evaluate(
            self,
            img_ids: Sequence[int],
            results: Sequence[InstanceData],
            eval_img_ids: Optional[Sequence[int]] = None) -> Dict[str, float]:
        """COCO box metrics.

        Args:
            img_ids (Sequence[int]): the COCO image id of each result.
            results (Sequence[InstanceData]): detections per image
                (``bboxes`` xyxy in original image coordinates, ``scores``,
                ``labels`` as contiguous class indices).
            eval_img_ids (Sequence[int], optional): the images to evaluate
                on; default ``img_ids`` (images without results count as
                images without detections).

        Returns:
            dict[str, float]: :data:`METRICS` as fractions (not rounded);
            ``nan`` where COCOeval gives -1 (no ground truth in that area
            range, or no ground truth at all).
        """
        key = self._memo_key(img_ids, results, eval_img_ids)
        if key is not None and 'full' in self._memo.get(key, {}):
            return dict(self._memo[key]['full'])
        coco_eval = self._cocoeval(img_ids, results, eval_img_ids)
        if coco_eval is None:
            metrics = {k: float('nan') for k in METRICS}
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                coco_eval.accumulate()
                coco_eval.summarize()
            stats = coco_eval.stats[:len(METRICS)]
            metrics = {
                k: float(v) if v > -1 else float('nan')
                for k, v in zip(METRICS, stats)
            }
        if key is not None:
            # the results are held so that their ids stay theirs
            self._memo.setdefault(key, dict(results=list(results)))
            self._memo[key]['full'] = dict(metrics)
        return metrics

    def evaluate_ap(self,
                    img_ids: Sequence[int],
                    results: Sequence[InstanceData],
                    eval_img_ids: Optional[Sequence[int]] = None) -> float:
        """The ``AP`` of :meth:`evaluate` alone, at a fraction of its
        cost: COCOeval matches and accumulates only the area range
        ``all`` and the ``maxDets`` the AP reads (100), and the AP is
        the mean ``summarize`` takes of the same precisions, so it equals
        ``evaluate(...)['AP']`` to the bit.

        Args:
            img_ids (Sequence[int]): the COCO image id of each result.
            results (Sequence[InstanceData]): detections per image.
            eval_img_ids (Sequence[int], optional): the images to evaluate
                on; default ``img_ids``.

        Returns:
            float: the AP (a fraction), ``nan`` without ground truth.
        """
        key = self._memo_key(img_ids, results, eval_img_ids)
        if key is not None and key in self._memo:
            known = self._memo[key]
            return known['full']['AP'] if 'full' in known else known['AP']
        if 100 not in self.proposal_nums:  # summarize() finds no AP
            return self.evaluate(img_ids, results, eval_img_ids)['AP']
        coco_eval = self._cocoeval(
            img_ids, results, eval_img_ids, all_area_only=True, max_dets=[100])
        ap = float('nan')
        if coco_eval is not None:
            with contextlib.redirect_stdout(io.StringIO()):
                coco_eval.accumulate()
            # summarize()'s AP: area 'all', maxDets 100, every IoU
            # threshold (a detection's match depends only on those scored
            # above it, so matching the top 100 alone changes none of
            # theirs)
            precision = coco_eval.eval['precision'][:, :, :, 0, -1]
            precision = precision[precision > -1]
            if len(precision):
                ap = float(np.mean(precision))
        if key is not None:
            self._memo[key] = dict(results=list(results), AP=ap)
        return ap

    def image_matches(self, img_ids: Sequence[int],
                      results: Sequence[InstanceData]) -> ImageMatches:
        """COCOeval's per-image matching of detections to ground truth
        (area ``all``, the first ``maxDets``), from which the box AP of any
        multiset of these images follows (:class:`ImageMatches`): the
        paired bootstrap over images resamples them.

        Args:
            img_ids (Sequence[int]): the COCO image ids (distinct).
            results (Sequence[InstanceData]): detections per image.

        Returns:
            ImageMatches: the matches.
        """
        img_ids = [int(i) for i in img_ids]
        if len(set(img_ids)) != len(img_ids):
            raise ValueError('image_matches needs distinct image ids')
        coco_eval = self._cocoeval(img_ids, results, all_area_only=True)
        if coco_eval is None:
            return ImageMatches([], [], img_ids, 0, 0)
        params = coco_eval.params
        # COCOeval sorts its images and categories
        return ImageMatches(
            coco_eval.matches,
            list(params.catIds),
            list(params.imgIds),
            self.proposal_nums[0],
            len(params.iouThrs),
            params.recThrs,
            order=img_ids)


def coco_evaluator_from_cfg(cfg, classes: Sequence[str]) -> CocoEvaluator:
    """A :class:`CocoEvaluator` on the ``ann_file`` of a config's
    ``test_evaluator`` (a ``CocoMetric`` or a list holding one)."""
    evaluators = cfg.get('test_evaluator')
    if not isinstance(evaluators, (list, tuple)):
        evaluators = [evaluators]
    for ev in evaluators:
        if ev and 'CocoMetric' in str(ev.get('type', '')) and \
                ev.get('ann_file'):
            return CocoEvaluator(ev['ann_file'], classes)
    raise ValueError('the config has no test_evaluator CocoMetric with an '
                     'ann_file')


def cache_evaluator(evaluator: CocoEvaluator) -> Callable:
    """``evaluate(cache, predictions, indices=None) -> metrics``: COCO
    metrics of predictions for the cached images ``indices`` (default all,
    in cache order), as the sweep, subset and self-calibration functions
    take it."""

    def evaluate(cache, predictions, indices=None) -> Dict[str, float]:
        ids = cache.img_ids()
        if indices is not None:
            ids = [ids[i] for i in indices]
        return evaluator.evaluate(ids, predictions)

    return evaluate
