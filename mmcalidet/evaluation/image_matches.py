# Copyright (c) mmcalidet contributors. All rights reserved.
"""Per-image COCO matches and the box AP of any multiset of their images
(:class:`ImageMatches`, made by
:meth:`~mmcalidet.evaluation.CocoEvaluator.image_matches`): what a paired
bootstrap over images resamples (:mod:`.bootstrap`).
"""
from typing import Dict, Optional, Sequence

import numpy as np

from .coco_matches import Matches


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

    def of_categories(self, cat_ids: Sequence[int]) -> 'ImageMatches':
        """The same matches over some of the categories only (their AP is
        the mean over those categories, e.g. the classes whose frequency a
        site keeps).

        Args:
            cat_ids (Sequence[int]): categories among :attr:`cat_ids`.

        Returns:
            ImageMatches: a view sharing this one's arrays.
        """
        keep = [int(c) for c in cat_ids]
        unknown = sorted(set(keep) - set(self.cat_ids))
        if unknown:
            raise ValueError(f'categories {unknown} are not matched here')
        rows = [self.cat_ids.index(c) for c in keep]
        out = object.__new__(ImageMatches)
        out.__dict__.update({
            k: v
            for k, v in self.__dict__.items() if k != '_hits'
        })
        out.cat_ids = keep
        out._detections = [self._detections[r] for r in rows]
        out._num_gt = self._num_gt[rows] if rows else \
            np.zeros((0, len(self.img_ids)), np.int64)
        return out

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
