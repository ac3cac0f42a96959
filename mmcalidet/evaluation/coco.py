# Copyright (c) mmcalidet contributors. All rights reserved.
"""COCO box metrics of detections, on any subset of the images.

The same COCOeval set-up as mmdet's ``CocoMetric`` (``maxDets`` 100 / 300
/ 1000, default IoU thresholds, categories of the model's classes), without
its JSON round trip and its rounding to three decimals, so that many small
evaluations (subsets, self-calibration iterations) are cheap and their
averages keep their precision. ``tests/test_evaluation`` checks that the
figures equal ``CocoMetric``'s up to that rounding. The matching runs in
numpy (:class:`~mmcalidet.evaluation.fast_cocoeval.FastCOCOeval`: the same
``evalImgs`` and precisions as pycocotools' to the bit).
"""
import contextlib
import io
import numbers
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from mmengine.structures import InstanceData

from ..utils.validation import check_float, check_int
from .fast_cocoeval import FastCOCOeval, GroundTruthTable, Matches

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
                      results: Sequence[InstanceData]) -> 'ImageMatches':
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


class ImageMatches:
    """Per-image COCO matches (:meth:`CocoEvaluator.image_matches`) and the
    box AP of any multiset of their images, as COCOeval's ``accumulate``
    computes it (area ``all``, ``maxDets`` 100): an image drawn twice
    counts twice.

    Args:
        eval_imgs (list | Matches): COCOeval's ``evalImgs``
            (category-major), or a :class:`FastCOCOeval`'s ``matches``
            (the same, as arrays).
        cat_ids (list[int]): the evaluated categories.
        img_ids (list[int]): the images, in ``evalImgs`` order.
        max_det (int): detections per image.
        num_iou (int): IoU thresholds.
        rec_thrs (np.ndarray, optional): the recall thresholds.
        order (list[int], optional): the images in the order positions
            refer to (default ``img_ids``).
    """

    def __init__(self,
                 eval_imgs,
                 cat_ids,
                 img_ids,
                 max_det: int,
                 num_iou: int,
                 rec_thrs=None,
                 order: Optional[Sequence[int]] = None) -> None:
        self.cat_ids = list(cat_ids)
        self.max_det = max_det
        self.num_iou = num_iou
        self.rec_thrs = rec_thrs
        num_imgs = len(img_ids)
        # positions follow ``order`` (the caller's), evalImgs ``img_ids``
        self.img_ids = list(img_ids if order is None else order)
        position = {img_id: i for i, img_id in enumerate(self.img_ids)}
        # per category, every image's detections in COCOeval's order (its
        # images, then a stable sort by score): the image position of each
        # and whether it is a true or a false positive at each IoU (T x D;
        # ignored detections are neither); per category and position, the
        # number of non-ignored ground truths
        self._detections = []
        self._num_gt = np.zeros((len(self.cat_ids), num_imgs), np.int64)
        if isinstance(eval_imgs, Matches):
            self._from_matches(eval_imgs, position)
            return
        for k in range(len(self.cat_ids)):
            where, scores, matches, ignore = [], [], [], []
            for i, img_id in enumerate(img_ids):
                e = eval_imgs[k * num_imgs + i]
                if e is None:
                    continue
                pos = position[img_id]
                self._num_gt[k, pos] = np.count_nonzero(
                    np.asarray(e['gtIgnore']) == 0)
                score = np.asarray(e['dtScores'][:max_det], np.float64)
                where.append(np.full(len(score), pos, np.int64))
                scores.append(score)
                matches.append(np.asarray(e['dtMatches'])[:, :max_det] > 0)
                ignore.append(
                    np.asarray(e['dtIgnore'])[:, :max_det].astype(bool))
            if not scores:
                self._detections.append(None)
                continue
            rank = np.argsort(-np.concatenate(scores), kind='mergesort')
            matches = np.concatenate(matches, axis=1)[:, rank]
            ignore = np.concatenate(ignore, axis=1)[:, rank]
            self._detections.append((np.concatenate(where)[rank],
                                     (matches & ~ignore).astype(np.float64),
                                     (~matches & ~ignore).astype(np.float64)))

    def _from_matches(self, matches: 'Matches', position: Dict) -> None:
        """What ``__init__`` reads from ``evalImgs``, from the arrays of
        a :class:`FastCOCOeval`'s matches (area range ``all``, the first):
        the same detections in the same order, without the per-image
        entries."""
        num_img = matches.num_img
        if [int(c) for c in matches.cat_ids] != self.cat_ids:
            raise ValueError('the matches are of other categories')
        pos = np.asarray([position[int(i)] for i in matches.img_ids], np.int64)
        gt_counted = ~matches.g_ignore[0]
        for k in range(len(self.cat_ids)):
            ds = matches.d_start[k * num_img]
            de = matches.d_start[(k + 1) * num_img]
            gs = matches.g_start[k * num_img]
            ge = matches.g_start[(k + 1) * num_img]
            gt_img = matches.g_group[gs:ge] - k * num_img
            np.add.at(self._num_gt[k], pos[gt_img], gt_counted[gs:ge])
            if ds == de and gs == ge:  # no entry of the category
                self._detections.append(None)
                continue
            top = ds + np.flatnonzero(matches.d_rank[ds:de] < self.max_det)
            rank = np.argsort(-matches.d_score[top], kind='mergesort')
            top = top[rank]
            where = pos[matches.d_group[top] - k * num_img]
            hit = matches.dt_matches[0][:, top] > 0
            ignore = matches.dt_ignore[0][:, top]
            self._detections.append((where, (hit & ~ignore).astype(np.float64),
                                     (~hit & ~ignore).astype(np.float64)))

    def ap(self, positions: Optional[Sequence[int]] = None) -> float:
        """Box AP (a fraction) of the images at ``positions`` (indices into
        ``img_ids``, repeats allowed; default each once); ``nan`` without
        ground truth.

        An image drawn c times counts c times: its detections weigh c in
        the cumulative true and false positives, as c copies of the image
        would (copies tie in score, so they are adjacent in COCOeval's
        order and add no other point to the precision-recall curve); an
        image not drawn weighs 0 (its detections repeat the point before
        them, which changes no interpolated precision).

        Args:
            positions (Sequence[int], optional): the images.

        Returns:
            float: the AP.
        """
        n = len(self.img_ids)
        if positions is None:
            weight = np.ones(n)
        else:
            positions = np.asarray(positions, np.int64).reshape(-1)
            weight = np.bincount(positions, minlength=n).astype(np.float64)
        if len(weight) > n:
            raise IndexError(f'positions must be below {n}')
        return float(self.weighted_ap(weight[None])[0])

    def ap_draws(self, draws) -> np.ndarray:
        """:meth:`ap` of many draws at once (a bootstrap's resamples).

        Args:
            draws (array-like): R x m positions, one draw per row.

        Returns:
            np.ndarray: R APs (``nan`` where a draw has no ground truth),
            equal to ``[self.ap(d) for d in draws]``.
        """
        n = len(self.img_ids)
        draws = np.asarray(draws, np.int64)
        if draws.ndim != 2:
            raise ValueError(f'draws must be R x m positions, got shape '
                             f'{draws.shape}')
        if draws.size and (draws.min() < 0 or draws.max() >= n):
            raise IndexError(f'positions must lie in [0, {n})')
        num = len(draws)
        rows = np.repeat(np.arange(num, dtype=np.int64), draws.shape[1])
        weights = np.bincount(
            rows * n + draws.ravel(), minlength=num * n).astype(np.float64)
        return self.weighted_ap(weights.reshape(num, n))

    def weighted_ap(self, weights: np.ndarray) -> np.ndarray:
        """Box AP of weighted images, a row of weights per draw: what
        :meth:`ap` computes, for all rows at once (per category, the draws
        are stacked; only the final mean over categories and IoU
        thresholds runs per draw, in :meth:`ap`'s order, so the figures
        are the same to the bit).

        Args:
            weights (np.ndarray): R x n image weights (how often each
                image is drawn).

        Returns:
            np.ndarray: R APs (``nan`` where no weighted ground truth).
        """
        weights = np.asarray(weights, np.float64)
        num_draws = len(weights)
        num_cats = len(self._detections)
        # ground truths per draw and category (integer sums: exact)
        num_gt = weights @ self._num_gt.T.astype(np.float64) \
            if num_cats else np.zeros((num_draws, 0))
        has_gt = num_gt != 0
        precisions = np.zeros((num_draws, num_cats, self.num_iou))
        for k, dets in enumerate(self._detections):
            draws = np.flatnonzero(has_gt[:, k])
            if not len(draws):
                continue
            where, true_pos, false_pos = dets
            hits, pad, counted = self._true_positions(k)
            if hits.shape[1] == 0:  # no true positive: precision 0
                continue
            # draws per step: a few million floats per cumulative array
            step = max(1, self._CHUNK // max(1, true_pos.size))
            for lo in range(0, len(draws), step):
                rows = draws[lo:lo + step]
                w = weights[rows][:, where]
                # the cumulative true positives and counted detections
                # (true + false positives) at the true positives only:
                # precision rises only there, so its monotone envelope
                # and the points where recall first reaches a threshold
                # are all among them. Integer sums: exact in any order.
                hit_w = w[:, hits]
                hit_w[:, pad] = 0.0
                tps = np.cumsum(hit_w, axis=2)
                if counted is None:  # nothing ignored: all counted
                    seen = np.cumsum(w, axis=1)[:, hits]
                else:
                    seen = np.cumsum(
                        counted * w[:, None, :],
                        axis=2)[:, np.arange(self.num_iou)[:, None], hits]
                precision = tps / (seen + np.spacing(1))
                precision[:, pad] = 0.0
                # COCOeval: precision made monotone, read at each threshold
                precision = np.maximum.accumulate(
                    precision[..., ::-1], axis=2)[..., ::-1]
                precisions[rows,
                           k] = self._at_thresholds(tps, precision,
                                                    num_gt[rows, k])
        out = np.full(num_draws, np.nan)
        for r in np.flatnonzero(has_gt.any(axis=1)):
            out[r] = precisions[r][has_gt[r]].ravel().mean()
        return out

    #: elements of one category's stacked draws (R x T x D) per step
    _CHUNK = 1 << 21

    def _true_positions(self, k: int):
        """Category ``k``'s true positives per IoU threshold, in score
        order: their detection indices, T x M (M: the most at any
        threshold; a row's tail padded with its last index, or 0), the
        padding mask, and the counted (not ignored) detections, T x D, or
        ``None`` when none is ignored."""
        if not hasattr(self, '_hits'):
            self._hits = {}
        if k not in self._hits:
            _, true_pos, false_pos = self._detections[k]
            rows = [np.flatnonzero(t) for t in true_pos]
            most = max((len(r) for r in rows), default=0)
            hits = np.zeros((len(rows), most), np.int64)
            pad = np.ones((len(rows), most), bool)
            for t, r in enumerate(rows):
                hits[t, :len(r)] = r
                hits[t, len(r):] = r[-1] if len(r) else 0
                pad[t, :len(r)] = False
            counted = true_pos + false_pos
            self._hits[k] = (hits, pad, None if counted.all() else counted)
        return self._hits[k]

    def _at_thresholds(self, tps: np.ndarray, precision: np.ndarray,
                       num_gt: np.ndarray) -> np.ndarray:
        """COCOeval's mean interpolated precision per draw and IoU
        threshold: at each recall threshold, the (monotone) precision where
        the recall ``tps / num_gt`` first reaches it, 0 where it never
        does.

        The rows are searched at once: recall reaches a threshold exactly
        when the true-positive count (an integer) reaches the least count
        whose recall, divided as COCOeval divides, does; the counts of row
        i (of R x T) are offset by i * (max num_gt + 2), so one sorted
        array holds them; with fewer ground truths than thresholds, each
        count is searched once, not each threshold.

        Args:
            tps (np.ndarray): cumulative true positives, R x T x D.
            precision (np.ndarray): monotone precision, R x T x D.
            num_gt (np.ndarray): the ground truths of each draw, R.

        Returns:
            np.ndarray: R x T mean precisions.
        """
        num_draws, num_iou, num_det = tps.shape
        if num_det == 0:
            return np.zeros((num_draws, num_iou))
        thrs = np.asarray(self.rec_thrs, np.float64)
        num_gt = np.asarray(num_gt, np.float64)[:, None]
        need = np.ceil(thrs * num_gt)
        need += need / num_gt < thrs
        need -= (need > 0) & ((need - 1) / num_gt >= thrs)
        num_rows = num_draws * num_iou
        span = num_gt.max() + 2
        offset = np.arange(
            num_rows, dtype=np.float64).reshape(num_draws, num_iou, 1) * span
        flat = (tps + offset).ravel()
        if span <= need.shape[1]:
            # few ground truths: the counts 0 .. num_gt + 1 are fewer than
            # the thresholds; search each once, then read each threshold's
            counts = np.arange(int(span), dtype=np.float64)
            found = np.searchsorted(
                flat, (counts + offset).ravel(),
                side='left').reshape(num_draws, num_iou, -1)
            found = np.take_along_axis(
                found,
                np.broadcast_to(
                    need.astype(np.int64)[:, None, :],
                    (num_draws, num_iou, need.shape[1])),
                axis=2)
        else:
            found = np.searchsorted(
                flat, (need[:, None, :] + offset).ravel(),
                side='left').reshape(num_draws, num_iou, -1)
        valid = found < (
            np.arange(1, num_rows + 1).reshape(num_draws, num_iou, 1) *
            num_det)
        picked = precision.ravel()[np.where(valid, found, 0)]
        return np.where(valid, picked, 0.0).mean(axis=2)


def paired_bootstrap(first: ImageMatches,
                     second: ImageMatches,
                     resamples: int = 1000,
                     seed: int = 0,
                     level: float = 0.95) -> Dict[str, float]:
    """AP(first) - AP(second) on the same images, with a paired bootstrap
    interval: images are resampled with replacement, both methods scored on
    each resample.

    Args:
        first (ImageMatches): one method's matches.
        second (ImageMatches): the other's, on the same images.
        resamples (int): bootstrap resamples.
        seed (int): their random seed.
        level (float): the interval's coverage.

    Returns:
        dict: ``diff`` (on all images, AP points), ``low``, ``high`` (the
        percentile interval, AP points), ``resamples``.
    """
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    check_int('resamples', resamples, 0)
    if first.img_ids != second.img_ids:
        raise ValueError('a paired bootstrap needs the same images')
    n = len(first.img_ids)
    rng = np.random.default_rng(seed)
    # the draws one by one (the stream of the seed), scored all at once
    draws = [rng.integers(0, n, size=n) for _ in range(int(resamples))]
    draws = np.stack(draws) if draws else np.zeros((0, n), np.int64)
    a, b = first.ap_draws(draws), second.ap_draws(draws)
    both = np.isfinite(a) & np.isfinite(b)
    diffs = list(100 * (a[both] - b[both]))
    tail = 100 * (1 - level) / 2
    low, high = (
        np.percentile(diffs, [tail, 100 - tail]) if diffs else
        (float('nan'), float('nan')))
    return dict(
        diff=100 * (first.ap() - second.ap()),
        low=float(low),
        high=float(high),
        resamples=len(diffs))
