# Copyright (c) mmcalidet contributors. All rights reserved.
"""COCOeval's per-image box matching as arrays: the ground truth
(:class:`GroundTruthTable`), pycocotools' box IoU pair by pair
(:func:`box_iou_pairs`) and the greedy matching of every image, category,
area range and IoU threshold at once (:class:`Matches`), with the
``evalImgs`` entries and the ``accumulate`` they give.
:class:`~mmcalidet.evaluation.fast_cocoeval.FastCOCOeval` runs them in
place of pycocotools' ``evaluateImg``.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np


class GroundTruthTable:
    """The boxes of a ``COCO`` object as arrays, in the order COCOeval
    reads them (per image, the annotation file's order); built once per
    ground truth and shared by its evaluations.

    Args:
        coco: a loaded ``COCO`` (pycocotools' or mmdet's wrapper).
    """

    def __init__(self, coco) -> None:
        anns = [
            coco.anns[ann['id']] for img_id in sorted(coco.imgToAnns)
            for ann in coco.imgToAnns[img_id]
        ]
        for ann in anns:
            missing = [k for k in ('bbox', 'area', 'iscrowd') if k not in ann]
            if missing:
                raise ValueError(
                    f'annotation {ann.get("id")!r} has no {missing[0]!r} '
                    '(COCO box evaluation needs bbox, area and iscrowd)')
        num = len(anns)
        self.img = np.fromiter((a['image_id'] for a in anns), np.int64, num)
        self.cat = np.fromiter((a['category_id'] for a in anns), np.int64, num)
        self.ids = np.fromiter((a['id'] for a in anns), np.int64, num)
        self.bbox = np.asarray([a['bbox'] for a in anns],
                               np.float64).reshape(num, 4)
        self.area = np.fromiter((a['area'] for a in anns), np.float64, num)
        self.crowd = np.fromiter((int(a['iscrowd']) for a in anns), np.int64,
                                 num) != 0
        self.img_ids = set(coco.imgs)


def box_iou_pairs(dt: np.ndarray, gt: np.ndarray,
                  crowd: np.ndarray) -> np.ndarray:
    """pycocotools' box IoU (``maskUtils.iou`` of xywh boxes, its C
    ``bbIou``), pair by pair, the same floating-point operations in the
    same order.

    Args:
        dt (np.ndarray): P x 4 detection boxes (x, y, w, h).
        gt (np.ndarray): P x 4 ground-truth boxes.
        crowd (np.ndarray): P flags: the ground truth is a crowd (the
            union is the detection's area).

    Returns:
        np.ndarray: P IoUs (0 where the boxes do not overlap).
    """
    w = np.minimum(dt[:, 2] + dt[:, 0], gt[:, 2] + gt[:, 0]) - np.maximum(
        dt[:, 0], gt[:, 0])
    h = np.minimum(dt[:, 3] + dt[:, 1], gt[:, 3] + gt[:, 1]) - np.maximum(
        dt[:, 1], gt[:, 1])
    inter = w * h
    dt_area = dt[:, 2] * dt[:, 3]
    union = np.where(crowd, dt_area, dt_area + gt[:, 2] * gt[:, 3] - inter)
    overlap = (w > 0) & (h > 0)
    out = np.zeros(len(dt))
    out[overlap] = inter[overlap] / union[overlap]
    return out


def _group_starts(groups: np.ndarray, num_groups: int) -> np.ndarray:
    """Start offsets of each group in a sorted group array (num_groups +
    1 entries)."""
    return np.searchsorted(groups, np.arange(num_groups + 1), side='left')


class Matches:
    """pycocotools' per-image matching (``evaluateImg`` for every
    category, area range and image) as arrays.

    Args:
        gt (GroundTruthTable): the ground truth.
        dets (np.ndarray): N x 7 detections (``loadRes``'s array).
        img_ids (Sequence): the images, sorted and distinct.
        cat_ids (Sequence): the categories, sorted and distinct.
        area_rngs (Sequence): ``[lo, hi]`` per area range.
        max_det (int): detections per image and category (the best).
        iou_thrs (np.ndarray): the IoU thresholds.
    """

    def __init__(self, gt: GroundTruthTable, dets: np.ndarray,
                 img_ids: Sequence, cat_ids: Sequence,
                 area_rngs: Sequence[Sequence[float]], max_det: int,
                 iou_thrs: np.ndarray) -> None:
        self.img_ids, self.cat_ids = list(img_ids), list(cat_ids)
        self.area_rngs, self.max_det = list(area_rngs), max_det
        img_arr = np.asarray(img_ids, np.int64)
        cat_arr = np.asarray(cat_ids, np.int64)
        num_img, num_cat = len(img_arr), len(cat_arr)
        num_area = len(area_rngs)
        thrs = np.minimum(np.asarray(iou_thrs, np.float64), 1 - 1e-10)
        num_thr = len(thrs)
        num_groups = num_cat * num_img
        self.num_img, self.num_thr = num_img, num_thr

        # ground truths of the evaluated images and categories, grouped
        # by (category, image), the file's order within a group
        sel = np.flatnonzero(
            np.isin(gt.img, img_arr) & np.isin(gt.cat, cat_arr))
        g_group = np.searchsorted(cat_arr, gt.cat[sel]) * num_img + \
            np.searchsorted(img_arr, gt.img[sel])
        order = np.argsort(g_group, kind='stable')
        sel, g_group = sel[order], g_group[order]
        g_box, g_area, g_crowd = gt.bbox[sel], gt.area[sel], gt.crowd[sel]
        self.g_ids = gt.ids[sel]
        self.g_group = g_group
        self.g_start = _group_starts(g_group, num_groups)
        g_count = np.diff(self.g_start)

        # detections likewise, best score first (ties: their order in the
        # array), the first max_det of each group
        d_img = dets[:, 0].astype(np.int64)
        d_cat = dets[:, 6].astype(np.int64)
        keep = np.flatnonzero(
            np.isin(d_img, img_arr) & np.isin(d_cat, cat_arr))
        d_group = np.searchsorted(cat_arr, d_cat[keep]) * num_img + \
            np.searchsorted(img_arr, d_img[keep])
        order = np.lexsort((keep, -dets[keep, 5], d_group))
        keep, d_group = keep[order], d_group[order]
        rank = np.arange(len(keep)) - _group_starts(d_group,
                                                    num_groups)[d_group]
        top = rank < max_det
        keep, self.d_group, self.d_rank = keep[top], d_group[top], rank[top]
        d_box, self.d_score = dets[keep, 1:5], dets[keep, 5]
        d_area = d_box[:, 2] * d_box[:, 3]  # loadRes's area
        self.d_ids = keep + 1
        self.d_start = _group_starts(self.d_group, num_groups)

        # ignored ground truth per area range (crowd, or outside it)
        lo = np.asarray([r[0] for r in area_rngs], np.float64)[:, None]
        hi = np.asarray([r[1] for r in area_rngs], np.float64)[:, None]
        self.g_ignore = g_crowd[None] | (g_area[None] < lo) | (
            g_area[None] > hi)
        d_outside = (d_area[None] < lo) | (d_area[None] > hi)

        # matches: gt index (in its group) per area, threshold, detection
        d_match = np.full((num_area, num_thr, len(keep)), -1, np.int64)
        self.g_match = np.zeros((num_area, num_thr, len(sel)), np.float64)
        _greedy_match(self.d_group, d_box, self.g_start, g_count, g_box,
                      g_crowd, self.g_ignore, thrs, self.d_ids, d_match,
                      self.g_match)
        matched = d_match >= 0
        g_index = np.where(matched,
                           d_match + self.g_start[self.d_group][None, None], 0)
        self.dt_matches = np.where(matched, self.g_ids[g_index],
                                   0).astype(np.float64)
        self.dt_ignore = np.zeros(d_match.shape, bool)
        for a in range(num_area):
            self.dt_ignore[a] = np.where(matched[a],
                                         self.g_ignore[a][g_index[a]], False)
        self.dt_ignore |= (self.dt_matches == 0) & d_outside[:, None, :]

    def eval_imgs(self) -> List[Optional[Dict]]:
        """pycocotools' ``evalImgs``.

        Returns:
            list: a dict per (category, area range, image), ``None`` where
            the image has neither ground truth nor detections of the
            category.
        """
        num_img, num_area = self.num_img, len(self.area_rngs)
        out: List[Optional[Dict]] = [None] * (
            len(self.cat_ids) * num_area * num_img)
        g_start, d_start = self.g_start.tolist(), self.d_start.tolist()
        present = np.flatnonzero((np.diff(self.g_start) > 0)
                                 | (np.diff(self.d_start) > 0)).tolist()
        d_ids, d_scores = self.d_ids.tolist(), self.d_score.tolist()
        num_gt = len(self.g_ids)
        for a in range(num_area):
            # the ground truths of a group, ignored last (stable)
            perm = np.lexsort(
                (np.arange(num_gt), self.g_ignore[a], self.g_group))
            gt_matches = self.g_match[a][:, perm]
            gt_ignore = self.g_ignore[a][perm].astype(np.int64)
            gt_ids = self.g_ids[perm].tolist()
            dt_matches, dt_ignore = self.dt_matches[a], self.dt_ignore[a]
            area_rng = self.area_rngs[a]
            for q in present:
                k, i = divmod(q, num_img)
                gs, ge = g_start[q], g_start[q + 1]
                ds, de = d_start[q], d_start[q + 1]
                out[(k * num_area + a) * num_img + i] = {
                    'image_id': self.img_ids[i],
                    'category_id': self.cat_ids[k],
                    'aRng': area_rng,
                    'maxDet': self.max_det,
                    'dtIds': d_ids[ds:de],
                    'gtIds': gt_ids[gs:ge],
                    'dtMatches': dt_matches[:, ds:de],
                    'gtMatches': gt_matches[:, gs:ge],
                    'dtScores': d_scores[ds:de],
                    'gtIgnore': gt_ignore[gs:ge] if ge > gs else np.array([]),
                    'dtIgnore': dt_ignore[:, ds:de],
                }
        return out

    def accumulate(self, rec_thrs: np.ndarray, max_dets: Sequence[int]):
        """pycocotools' ``accumulate`` of these matches: per category,
        area range and ``maxDets``, the detections of all images (each
        image's best ``maxDets``) by score, cumulative true and false
        positives, precision made monotone and read at each recall
        threshold. The same operations on the same arrays, so the same
        figures to the bit (the monotone envelope is a running maximum,
        exact in any order).

        Args:
            rec_thrs (np.ndarray): the recall thresholds.
            max_dets (Sequence[int]): the ``maxDets``.

        Returns:
            tuple: precision (T x R x K x A x M), recall (T x K x A x M)
            and scores (T x R x K x A x M), -1 where not defined.
        """
        num_thr, num_rec = self.num_thr, len(rec_thrs)
        num_cat, num_area = len(self.cat_ids), len(self.area_rngs)
        num_max = len(max_dets)
        precision = -np.ones((num_thr, num_rec, num_cat, num_area, num_max))
        recall = -np.ones((num_thr, num_cat, num_area, num_max))
        scores = -np.ones((num_thr, num_rec, num_cat, num_area, num_max))
        num_img = self.num_img
        for k in range(num_cat):
            ds, de = self.d_start[k * num_img], self.d_start[(k + 1) * num_img]
            gs, ge = self.g_start[k * num_img], self.g_start[(k + 1) * num_img]
            if ds == de and gs == ge:  # every entry None: skipped
                continue
            for m, max_det in enumerate(max_dets):
                top = ds + np.flatnonzero(self.d_rank[ds:de] < max_det)
                det_scores = self.d_score[top]
                inds = np.argsort(-det_scores, kind='mergesort')
                sorted_scores = det_scores[inds]
                for a in range(num_area):
                    npig = np.count_nonzero(~self.g_ignore[a, gs:ge])
                    if npig == 0:
                        continue
                    dtm = self.dt_matches[a][:, top][:, inds]
                    dt_ig = self.dt_ignore[a][:, top][:, inds]
                    tps = np.logical_and(dtm, np.logical_not(dt_ig))
                    fps = np.logical_and(
                        np.logical_not(dtm), np.logical_not(dt_ig))
                    tp_sum = np.cumsum(tps, axis=1).astype(dtype=float)
                    fp_sum = np.cumsum(fps, axis=1).astype(dtype=float)
                    num_det = tp_sum.shape[1]
                    rc = tp_sum / npig
                    pr = tp_sum / (fp_sum + tp_sum + np.spacing(1))
                    recall[:, k, a, m] = rc[:, -1] if num_det else 0
                    if not num_det:
                        precision[:, :, k, a, m] = 0
                        scores[:, :, k, a, m] = 0
                        continue
                    pr = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1]
                    for t in range(num_thr):
                        found = np.searchsorted(rc[t], rec_thrs, side='left')
                        valid = found < num_det
                        found = np.where(valid, found, 0)
                        precision[t, :, k, a,
                                  m] = np.where(valid, pr[t][found], 0)
                        scores[t, :, k, a,
                               m] = np.where(valid, sorted_scores[found], 0)
        return precision, recall, scores


def _greedy_match(d_group, d_box, g_start, g_count, g_box, g_crowd, g_ignore,
                  thrs, d_ids, d_match, g_match) -> None:
    """``evaluateImg``'s greedy matching for every group, area range and
    threshold at once, one step per detection rank: each detection takes
    the ground truth of highest IoU (at least the threshold; the last of
    equal ones) among those not taken (crowds stay free), not ignored
    first, ignored only where none is left. Fills ``d_match`` (the
    ground truth's index in its group, -1: none) and ``g_match`` (the
    last detection id taken it, 0: none) in place."""
    num_area, num_thr = d_match.shape[:2]
    # detection x ground truth pairs of the same group
    pair_count = g_count[d_group]
    pair_det = np.repeat(np.arange(len(d_group)), pair_count)
    if not len(pair_det):
        return
    first = np.cumsum(pair_count) - pair_count
    local = np.arange(len(pair_det)) - np.repeat(first, pair_count)
    pair_gt = g_start[d_group][pair_det] + local
    iou = box_iou_pairs(d_box[pair_det], g_box[pair_gt], g_crowd[pair_gt])
    # only the detections with an IoU at the lowest threshold can match
    hit = iou >= thrs.min()
    cand = np.zeros(len(d_group), bool)
    cand[pair_det[hit]] = True
    if not cand.any():
        return
    cand_idx = np.flatnonzero(cand)  # sorted by group, then rank
    cand_group = d_group[cand_idx]
    groups, counts = np.unique(cand_group, return_counts=True)
    # candidate rank within its group (cand_idx is grouped, in rank order)
    c_rank = np.arange(len(cand_idx)) - np.searchsorted(cand_group, cand_group)
    # groups with the most candidates first: step j runs the first
    # active[j] of them
    by_count = np.argsort(-counts, kind='stable')
    groups, counts = groups[by_count], counts[by_count]
    num_q = len(groups)
    most_gt = int(g_count[groups].max())
    ious = np.full((num_q, counts[0], most_gt), -1.0)
    q_of_group = np.full(len(g_count), -1, np.int64)
    q_of_group[groups] = np.arange(num_q)
    cq = q_of_group[cand_group]
    det_slot = np.full(len(d_group), -1, np.int64)
    det_slot[cand_idx] = c_rank
    on_cand = cand[pair_det]
    pq = q_of_group[d_group[pair_det[on_cand]]]
    ious[pq, det_slot[pair_det[on_cand]], local[on_cand]] = iou[on_cand]
    # per group slot: ground-truth flags (padding: ignored, never matched)
    gt_slot = g_start[groups][:, None] + np.arange(most_gt)[None]
    real = np.arange(most_gt)[None] < g_count[groups][:, None]
    gt_slot = np.where(real, gt_slot, 0)
    crowd = g_crowd[gt_slot] & real  # Q x G
    ignore = np.moveaxis(g_ignore[:, gt_slot], 0, 1) | ~real[:, None]
    regular = ~ignore  # Q x A x G
    det_of = np.full((num_q, counts[0]), -1, np.int64)
    det_of[cq, c_rank] = cand_idx
    taken = np.zeros((num_q, num_area, num_thr, most_gt), bool)
    active = (counts[None] > np.arange(counts[0])[:, None]).sum(axis=1)
    rev = most_gt - 1
    for j in range(counts[0]):
        n = active[j]
        row = ious[:n, j]  # n x G
        ok = (row[:, None, :] >= thrs[None, :, None])[:, None] & (
            ~taken[:n] | crowd[:n, None, None])  # n x A x T x G
        reg = ok & regular[:n, :, None]
        ign = ok & ignore[:n, :, None]
        val = row[:, None, None, :]
        m_reg = rev - np.argmax(np.where(reg, val, -1.0)[..., ::-1], axis=-1)
        m_ign = rev - np.argmax(np.where(ign, val, -1.0)[..., ::-1], axis=-1)
        m = np.where(reg.any(-1), m_reg, np.where(ign.any(-1), m_ign, -1))
        qi, ai, ti = np.nonzero(m >= 0)
        if not len(qi):
            continue
        gi = m[qi, ai, ti]
        taken[qi, ai, ti, gi] = True
        dets = det_of[qi, j]
        d_match[ai, ti, dets] = gi
        g_match[ai, ti, g_start[groups[qi]] + gi] = d_ids[dets]
