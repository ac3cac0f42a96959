# Copyright (c) mmcalidet contributors. All rights reserved.
"""FastCOCOeval: pycocotools' box evaluation with the matching in numpy,
entry by entry the same ``evalImgs`` and to the bit the same
``accumulate`` and ``summarize``."""
import contextlib
import io
import json
import os.path as osp

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from mmcalidet.evaluation.coco_matches import GroundTruthTable, box_iou_pairs
from mmcalidet.evaluation.fast_cocoeval import FastCOCOeval


def _coco(dataset):
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def random_case(seed, num_imgs=25, num_cats=5, coarse=True, crowd=0.15):
    """Ground truth with crowds, images without boxes and a category
    without any, areas across COCO's ranges; detections near the boxes
    (some of another category) and random ones. ``coarse``: integer boxes
    and three score values, so IoUs and scores tie often."""
    rng = np.random.default_rng(seed)
    imgs = [
        dict(id=int(i), width=100, height=100)
        for i in rng.choice(1000, num_imgs, replace=False)
    ]
    cats = [dict(id=c, name=str(c)) for c in range(1, num_cats + 2)]
    anns = []
    for img in imgs[2:]:  # the first two images have no ground truth
        for _ in range(rng.integers(0, 6)):
            if coarse:
                x, y = rng.integers(0, 80, 2)
                w, h = rng.integers(1, 60, 2)
            else:
                x, y = rng.uniform(0, 80, 2)
                w, h = rng.uniform(0.5, 60, 2)
            anns.append(
                dict(
                    id=len(anns) + 1,
                    image_id=img['id'],
                    category_id=int(rng.integers(1, num_cats + 1)),
                    bbox=[float(x), float(y),
                          float(w), float(h)],
                    # small, medium and large boxes
                    area=float(w * h) * float(rng.choice([1, 30, 100])),
                    iscrowd=int(rng.random() < crowd)))
    coco = _coco(dict(images=imgs, categories=cats, annotations=anns))
    dets = []
    for img in imgs:
        gts = coco.imgToAnns[img['id']]
        for _ in range(rng.integers(0, 15)):
            if gts and rng.random() < 0.6:
                g = gts[rng.integers(len(gts))]
                jitter = rng.integers(-3, 4, 4) if coarse else rng.normal(
                    0, 2, 4)
                box = np.asarray(g['bbox']) + jitter
                cat = g['category_id'] if rng.random() < 0.8 else int(
                    rng.integers(1, num_cats + 1))
            else:
                box = np.r_[rng.integers(0, 80, 2),
                            rng.integers(0, 50, 2)].astype(float)
                cat = int(rng.integers(1, num_cats + 1))
            score = float(rng.choice([0.1, 0.5, 0.9])) if coarse else float(
                rng.random())
            dets.append([img['id'], *box, score, cat])
    return coco, np.asarray(dets, np.float64).reshape(-1, 7)


def run_both(coco, dets, set_params=None, summarize=True):
    """pycocotools' COCOeval (on ``loadRes``) and FastCOCOeval, evaluated
    and accumulated with the same parameters."""
    out = []
    with contextlib.redirect_stdout(io.StringIO()):
        for ev in (COCOeval(coco, coco.loadRes(dets),
                            'bbox'), FastCOCOeval(coco, dets)):
            if set_params is not None:
                set_params(ev.params)
            ev.evaluate()
            ev.accumulate()
            if summarize:
                ev.summarize()
            out.append(ev)
    return out


def assert_same(ref, fast):
    """The same evalImgs entry by entry (arrays: shape, dtype, values) and
    the same accumulated arrays to the bit."""
    assert len(ref.evalImgs) == len(fast.evalImgs)
    for i, (a, b) in enumerate(zip(ref.evalImgs, fast.evalImgs)):
        assert (a is None) == (b is None), i
        if a is None:
            continue
        assert a.keys() == b.keys()
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, np.ndarray):
                y = np.asarray(y)
                assert x.shape == y.shape and x.dtype == y.dtype, (i, key)
                assert np.array_equal(x, y), (i, key)
            else:
                assert list(x) == list(y) if key in ('dtIds', 'gtIds',
                                                     'dtScores',
                                                     'aRng') else x == y, (i,
                                                                           key)
    for key in ('precision', 'recall', 'scores'):
        assert ref.eval[key].shape == fast.eval[key].shape, key
        assert np.array_equal(ref.eval[key], fast.eval[key]), key
    if hasattr(ref, 'stats'):
        assert np.array_equal(ref.stats, fast.stats)


@pytest.mark.parametrize('seed', range(12))
def test_random_cases_match_pycocotools(seed):
    coco, dets = random_case(
        seed, coarse=seed % 2 == 0, crowd=0.0 if seed % 3 == 0 else 0.15)
    max_dets = [[1, 3, 5], [100, 300, 1000], [2, 4, 6]][seed % 3]

    def set_params(p):
        p.maxDets = max_dets  # 1-6: each image's best detections only
        if seed % 4 == 1:
            p.imgIds = p.imgIds[::2]
        if seed % 4 == 2:
            p.catIds = p.catIds[:3]

    assert_same(*run_both(coco, dets, set_params))


def test_fewer_area_ranges_and_one_max_det():
    """The set-ups CocoEvaluator uses: the ranges with ground truth, and
    evaluate_ap's / image_matches' area 'all' with maxDets 100."""
    coco, dets = random_case(3)

    def two_ranges(p):
        p.areaRng, p.areaRngLbl = p.areaRng[:2], p.areaRngLbl[:2]

    assert_same(*run_both(coco, dets, two_ranges))

    def all_only(p):
        p.areaRng, p.areaRngLbl = p.areaRng[:1], p.areaRngLbl[:1]
        p.maxDets = [100]

    assert_same(*run_both(coco, dets, all_only, summarize=False))


def test_score_and_iou_ties_keep_pycocotools_order():
    """Equal scores keep the detections' order; a detection equally close
    to two ground truths takes the later one; a crowd is matched by every
    detection on it (its gtMatches: the last)."""
    imgs = [dict(id=1), dict(id=2)]
    anns = [
        dict(
            id=1,
            image_id=1,
            category_id=1,
            bbox=[0, 0, 10, 10],
            area=100,
            iscrowd=0),
        dict(
            id=2,
            image_id=1,
            category_id=1,
            bbox=[0, 0, 10, 10],
            area=100,
            iscrowd=0),
        dict(
            id=3,
            image_id=2,
            category_id=1,
            bbox=[0, 0, 50, 50],
            area=2500,
            iscrowd=1),
    ]
    coco = _coco(
        dict(images=imgs, categories=[dict(id=1, name='a')], annotations=anns))
    dets = np.array([[1, 0, 0, 10, 10, 0.5, 1], [1, 0, 0, 10, 10, 0.5, 1],
                     [1, 0, 0, 10, 10, 0.5, 1], [2, 0, 0, 10, 10, 0.7, 1],
                     [2, 5, 5, 10, 10, 0.7, 1]])
    ref, fast = run_both(coco, dets)
    assert_same(ref, fast)
    first = fast.evalImgs[0]
    assert first['dtMatches'][0].tolist() == [2, 1, 0]
    crowd = fast.evalImgs[1]
    assert crowd['gtMatches'][0].tolist() == [5]


def test_real_annotations(datasets_dir):
    """coco-mini's val annotations (80 categories, crowds): jittered
    ground-truth boxes with random scores and false positives."""
    ann = osp.join(datasets_dir, 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    with open(ann) as f:
        data = json.load(f)
    coco = _coco(data)
    rng = np.random.default_rng(0)
    rows = []
    for a in data['annotations']:
        x, y, w, h = a['bbox']
        for _ in range(2):
            box = np.asarray([x, y, w, h
                              ]) + rng.normal(0, 0.1, 4) * [w, h, w, h]
            rows.append([a['image_id'], *box, rng.random(), a['category_id']])
    for img in data['images']:
        for _ in range(3):
            rows.append([
                img['id'], *rng.uniform(0, 300, 2), *rng.uniform(5, 200, 2),
                rng.random(),
                rng.choice([c['id'] for c in data['categories']])
            ])
    assert_same(*run_both(coco, np.asarray(rows, np.float64)))


def test_accumulate_with_other_params_is_pycocotools():
    coco, dets = random_case(5)
    ref, fast = run_both(coco, dets)
    with contextlib.redirect_stdout(io.StringIO()):
        for ev in (ref, fast):
            p = ev.params
            other = type(p)(iouType='bbox')
            other.imgIds, other.catIds = p.imgIds, p.catIds[:2]
            other.maxDets = p.maxDets[:1]
            ev.accumulate(other)
    assert np.array_equal(ref.eval['precision'], fast.eval['precision'])


def test_box_iou_is_pycocotools():
    from pycocotools import mask
    rng = np.random.default_rng(1)
    dt = rng.uniform(0, 20, (200, 4))
    gt = rng.uniform(0, 20, (7, 4))
    crowd = np.array([0, 1, 0, 0, 1, 0, 0])
    ref = mask.iou(dt.tolist(), gt.tolist(), crowd.tolist())
    d, g = np.meshgrid(np.arange(200), np.arange(7), indexing='ij')
    ours = box_iou_pairs(dt[d.ravel()], gt[g.ravel()], crowd[g.ravel()]
                         != 0).reshape(200, 7)
    assert np.array_equal(ref, ours)


def test_errors():
    coco, dets = random_case(0)
    with pytest.raises(ValueError, match='N x 7'):
        FastCOCOeval(coco, dets[:, :6])
    bad = dets.copy()
    bad[0, 0] = 99999
    with pytest.raises(ValueError, match='image 99999'):
        FastCOCOeval(coco, bad)
    ev = FastCOCOeval(coco, dets)
    ev.params.iouType = 'segm'
    with pytest.raises(ValueError, match='bbox'):
        ev.evaluate()
    data = dict(coco.dataset)
    data['annotations'] = [dict(a) for a in data['annotations']]
    del data['annotations'][0]['iscrowd']
    with pytest.raises(ValueError, match='iscrowd'):
        GroundTruthTable(_coco(data))


@pytest.mark.parametrize('seed', range(4))
def test_image_matches_from_the_arrays(seed):
    """ImageMatches built from the matches' arrays holds what it builds
    from pycocotools' evalImgs: the same detections in the same order, and
    the same bootstrap APs to the bit."""
    from mmcalidet.evaluation import ImageMatches
    coco, dets = random_case(seed, coarse=seed % 2 == 0)
    ref, fast = run_both(
        coco, dets, lambda p: setattr(p, 'maxDets', [3]), summarize=False)
    p = ref.params
    p.areaRng, p.areaRngLbl = p.areaRng[:1], p.areaRngLbl[:1]
    with contextlib.redirect_stdout(io.StringIO()):
        ref.evaluate()
        fast.params.areaRng = p.areaRng
        fast.evaluate()
    order = list(np.random.default_rng(seed).permutation(p.imgIds))
    args = (list(p.catIds), list(p.imgIds), 3, len(p.iouThrs), p.recThrs)
    a = ImageMatches(ref.evalImgs, *args, order=order)
    b = ImageMatches(fast.matches, *args, order=order)
    assert np.array_equal(a._num_gt, b._num_gt)
    for x, y in zip(a._detections, b._detections):
        assert (x is None) == (y is None)
        if x is not None:
            assert all(np.array_equal(u, v) for u, v in zip(x, y))
    draws = np.random.default_rng(1).integers(0, len(order), (20, 9))
    assert np.array_equal(a.ap_draws(draws), b.ap_draws(draws), equal_nan=True)
    assert a.ap() == b.ap() or (np.isnan(a.ap()) and np.isnan(b.ap()))
