# Copyright (c) mmcalidet contributors. All rights reserved.
"""The bootstrap's AP of many draws at once (``ImageMatches.ap_draws``,
``paired_bootstrap``) against COCOeval's accumulation on the drawn images
copy by copy, on random per-image matches (no detector, no data files);
``CocoEvaluator.evaluate_ap`` and remembered evaluations against
``evaluate``."""
import numpy as np
import pytest

from mmcalidet.evaluation import ImageMatches, paired_bootstrap

NUM_IOU = 10
REC_THRS = np.linspace(.0, 1.00, 101, endpoint=True)
MAX_DET = 100


def random_eval_imgs(num_cats, num_imgs, seed):
    """COCOeval-like ``evalImgs`` (category-major): random scores, matches
    and ignore flags; some entries ``None`` (no ground truth nor
    detection), some images with ground truth and no detection."""
    rng = np.random.default_rng(seed)
    eval_imgs = []
    for _ in range(num_cats):
        for _ in range(num_imgs):
            num_gt = int(rng.integers(0, 4))
            num_dt = int(rng.integers(0, 6))
            if num_gt == 0 and num_dt == 0:
                eval_imgs.append(None)
                continue
            # distinct scores (a tie would order copies apart)
            scores = np.sort(rng.uniform(size=num_dt))[::-1]
            gt_ignore = (rng.uniform(size=num_gt) < 0.2).astype(int)
            # per IoU, at most one detection per counted ground truth is a
            # match; some unmatched ones are ignored (out of area range)
            matches = np.zeros((NUM_IOU, num_dt))
            most = min(num_dt, int(np.count_nonzero(gt_ignore == 0)))
            for t in range(NUM_IOU):
                hit = rng.permutation(num_dt)[:rng.integers(0, most + 1)]
                matches[t, hit] = 1
            ignore = (matches == 0) & (
                rng.uniform(size=(NUM_IOU, num_dt)) < 0.1)
            eval_imgs.append(
                dict(
                    dtScores=list(scores),
                    dtMatches=matches,
                    dtIgnore=ignore,
                    gtIgnore=gt_ignore))
    return eval_imgs


def copy_by_copy_ap(eval_imgs, num_cats, num_imgs, positions):
    """COCOeval's ``accumulate`` (area all) on a data set holding the drawn
    images, each as often as drawn (in COCOeval's order of images: its
    sorted ids, so that copies are adjacent and detections that tie in
    score keep the images' order)."""
    positions = np.sort(np.asarray(positions))
    precisions = []
    for k in range(num_cats):
        entries = [eval_imgs[k * num_imgs + i] for i in positions]
        entries = [e for e in entries if e is not None]
        npig = sum(
            int(np.count_nonzero(np.asarray(e['gtIgnore']) == 0))
            for e in entries)
        if npig == 0:
            continue
        scores = np.concatenate(
            [np.asarray(e['dtScores'][:MAX_DET]) for e in entries])
        order = np.argsort(-scores, kind='mergesort')
        matches = np.concatenate(
            [e['dtMatches'][:, :MAX_DET] for e in entries], axis=1)[:,
                                                                    order] > 0
        ignore = np.concatenate([e['dtIgnore'][:, :MAX_DET] for e in entries],
                                axis=1)[:, order].astype(bool)
        tps = np.cumsum(matches & ~ignore, axis=1, dtype=np.float64)
        fps = np.cumsum(~matches & ~ignore, axis=1, dtype=np.float64)
        for tp, fp in zip(tps, fps):
            recall = tp / npig
            precision = tp / (fp + tp + np.spacing(1))
            precision = np.maximum.accumulate(precision[::-1])[::-1]
            q = np.zeros(len(REC_THRS))
            idx = np.searchsorted(recall, REC_THRS, side='left')
            valid = idx < len(precision)
            q[valid] = precision[idx[valid]]
            precisions.append(q.mean())
    return float(np.mean(precisions)) if precisions else float('nan')


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_ap_of_many_draws_equals_copy_by_copy(seed):
    num_cats, num_imgs = 6, 15
    eval_imgs = random_eval_imgs(num_cats, num_imgs, seed)
    matches = ImageMatches(eval_imgs, list(range(1, num_cats + 1)),
                           list(range(num_imgs)), MAX_DET, NUM_IOU, REC_THRS)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, num_imgs, size=(40, num_imgs))
    # a draw of one image, possibly without ground truth at all
    draws[0] = draws[0, 0]
    fast = matches.ap_draws(draws)
    reference = np.array(
        [copy_by_copy_ap(eval_imgs, num_cats, num_imgs, d) for d in draws])
    assert fast.shape == (40, )
    assert np.array_equal(np.isnan(fast), np.isnan(reference))
    ok = ~np.isnan(reference)
    assert ok.sum() > 30
    np.testing.assert_allclose(fast[ok], reference[ok], rtol=0, atol=1e-9)
    # one draw at a time is the same computation
    assert np.array_equal(
        fast, np.array([matches.ap(d) for d in draws]), equal_nan=True)
    assert matches.ap() == pytest.approx(
        copy_by_copy_ap(eval_imgs, num_cats, num_imgs, range(num_imgs)),
        abs=1e-9)


def test_paired_bootstrap_scores_every_draw_as_ap_does():
    num_cats, num_imgs = 5, 12
    first = ImageMatches(
        random_eval_imgs(num_cats, num_imgs, 3), list(range(num_cats)),
        list(range(num_imgs)), MAX_DET, NUM_IOU, REC_THRS)
    second = ImageMatches(
        random_eval_imgs(num_cats, num_imgs, 4), list(range(num_cats)),
        list(range(num_imgs)), MAX_DET, NUM_IOU, REC_THRS)
    out = paired_bootstrap(first, second, resamples=200, seed=5)
    rng = np.random.default_rng(5)
    diffs = []
    for _ in range(200):
        draw = rng.integers(0, num_imgs, size=num_imgs)
        a, b = first.ap(draw), second.ap(draw)
        if np.isfinite(a) and np.isfinite(b):
            diffs.append(100 * (a - b))
    low, high = np.percentile(diffs, [2.5, 97.5])
    assert out['resamples'] == len(diffs)
    assert (out['low'], out['high']) == (low, high)
    assert out['diff'] == 100 * (first.ap() - second.ap())


def test_ap_draws_rejects_bad_positions():
    matches = ImageMatches(
        random_eval_imgs(2, 4, 0), [1, 2], list(range(4)), MAX_DET, NUM_IOU,
        REC_THRS)
    with pytest.raises(IndexError, match=r'\[0, 4\)'):
        matches.ap_draws([[0, 4]])
    with pytest.raises(ValueError, match='R x m'):
        matches.ap_draws([0, 1])


def test_evaluate_ap_equals_evaluate_to_the_bit():
    """``CocoEvaluator.evaluate_ap`` (area all, maxDets 100 only) gives
    ``evaluate``'s AP exactly, on coco-mini with jittered ground truth
    and false positives (several area ranges hold ground truth)."""
    import os.path as osp

    from mmdet.datasets import CocoDataset
    from mmengine.structures import InstanceData

    from mmcalidet.evaluation import CocoEvaluator
    from testing import data_root
    evaluator = CocoEvaluator(
        osp.join(data_root(), 'coco-mini', 'reference',
                 'instances_val2017_coco-mini.json'),
        list(CocoDataset.METAINFO['classes']))
    label = {c: k for k, c in enumerate(evaluator.cat_ids)}
    rng = np.random.default_rng(0)
    ids, results = [], []
    for img_id in evaluator.all_img_ids[:40]:
        anns = evaluator.coco.imgToAnns.get(img_id, [])
        boxes = np.array([[x, y, x + w, y + h]
                          for x, y, w, h in (a['bbox'] for a in anns)])
        boxes = np.concatenate([boxes.reshape(-1, 4), [[5., 5., 90., 70.]]])
        ids.append(img_id)
        results.append(
            InstanceData(
                bboxes=boxes + rng.normal(0, 5, boxes.shape),
                scores=rng.uniform(size=len(boxes)),
                labels=np.array([label[a['category_id']] for a in anns] +
                                [int(rng.integers(len(label)))])))
    for sub in (slice(0, 40), slice(3, 15), slice(7, 8)):
        full = evaluator.evaluate(ids[sub], results[sub])['AP']
        fast = evaluator.evaluate_ap(ids[sub], results[sub])
        assert np.isnan(full) == np.isnan(fast)
        assert np.isnan(full) or fast == full
    assert 0 < evaluator.evaluate_ap(ids, results) < 1
    # remembered: the same detection objects on the same images are
    # evaluated once (evaluate's AP serves evaluate_ap too)
    evaluator.remember()
    full = evaluator.evaluate(ids[:10], results[:10])
    evaluator._cocoeval = None  # any evaluation now fails
    assert evaluator.evaluate(ids[:10], list(results[:10])) == full
    assert evaluator.evaluate_ap(ids[:10], results[:10]) == full['AP']
    with pytest.raises(TypeError):  # other detections: evaluated
        evaluator.evaluate(
            ids[:10],
            [InstanceData(**r) for r in (x.to_dict() for x in results[:10])])
    evaluator.remember(False)
    with pytest.raises(TypeError):
        evaluator.evaluate(ids[:10], results[:10])
