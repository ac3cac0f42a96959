# Copyright (c) mmcalidet contributors. All rights reserved.
"""COCO metrics glue: the same figures as mmdet's CocoMetric."""
import json
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.evaluation import CocoMetric
from mmengine.structures import InstanceData

from mmcalidet.evaluation import METRICS, CocoEvaluator


@pytest.fixture(scope='module')
def coco(datasets_dir):
    ann = osp.join(datasets_dir, 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    with open(ann) as f:
        data = json.load(f)
    cats = sorted(data['categories'], key=lambda c: c['id'])
    return ann, data, [c['name'] for c in cats], {
        c['id']: k
        for k, c in enumerate(cats)
    }


def predictions(data, index, images, noise, seed=0, fps=4):
    """Ground-truth boxes moved by ``noise`` (relative) with random scores,
    plus random false positives."""
    rng = np.random.default_rng(seed)
    out = []
    for img in images:
        boxes, scores, labels = [], [], []
        for ann in data['annotations']:
            if ann['image_id'] != img['id']:
                continue
            x, y, w, h = ann['bbox']
            j = rng.normal(0, noise, 4) * [w, h, w, h]
            boxes.append([x + j[0], y + j[1], x + w + j[2], y + h + j[3]])
            scores.append(rng.uniform(0.2, 1.0) if noise else 1.0)
            labels.append(index[ann['category_id']])
        for _ in range(fps):
            x, y = rng.uniform(0, 300, 2)
            boxes.append([x, y, x + 60, y + 40])
            scores.append(rng.uniform(0, 0.9))
            labels.append(int(rng.integers(80)))
        out.append(
            InstanceData(
                bboxes=torch.tensor(boxes, dtype=torch.float32).view(-1, 4),
                scores=torch.tensor(scores, dtype=torch.float32),
                labels=torch.tensor(labels, dtype=torch.long)))
    return out


def coco_metric(ann, classes, images, preds):
    metric = CocoMetric(ann_file=ann, metric='bbox')
    metric.dataset_meta = dict(classes=classes)
    metric.img_ids = [img['id'] for img in images]
    for img, p in zip(images, preds):
        metric.process({}, [
            dict(
                pred_instances=dict(
                    bboxes=p.bboxes, scores=p.scores, labels=p.labels),
                img_id=img['id'],
                ori_shape=(img['height'], img['width']))
        ])
    res = metric.compute_metrics(metric.results)
    keys = ('bbox_mAP', 'bbox_mAP_50', 'bbox_mAP_75', 'bbox_mAP_s',
            'bbox_mAP_m', 'bbox_mAP_l')
    return dict(zip(METRICS, (res[k] for k in keys)))


def test_equals_coco_metric_up_to_its_rounding(coco):
    ann, data, classes, index = coco
    ev = CocoEvaluator(ann, classes)
    for images in (data['images'][:10], data['images'][20:23]):
        preds = predictions(data, index, images, noise=0.15)
        ours = ev.evaluate([img['id'] for img in images], preds)
        ref = coco_metric(ann, classes, images, preds)
        assert 0.05 < ours['AP'] < 0.95
        for m in METRICS:
            if ref[m] == -1:
                assert np.isnan(ours[m]), m
            else:
                assert abs(ours[m] - ref[m]) <= 5e-4 + 1e-9, m


def test_perfect_empty_and_subset(coco):
    ann, data, classes, index = coco
    ev = CocoEvaluator(ann, classes)
    images = data['images'][:6]
    ids = [img['id'] for img in images]
    perfect = predictions(data, index, images, noise=0.0, fps=0)
    res = ev.evaluate(ids, perfect)
    assert res['AP'] == pytest.approx(1.0)
    empty = [
        InstanceData(
            bboxes=torch.zeros(0, 4),
            scores=torch.zeros(0),
            labels=torch.zeros(0, dtype=torch.long)) for _ in images
    ]
    res = ev.evaluate(ids, empty)
    assert res['AP'] == 0.0
    # area ranges without ground truth stay undefined, as in COCOeval
    ref = coco_metric(ann, classes, images,
                      predictions(data, index, images, 0.1))
    for m in METRICS:
        assert np.isnan(res[m]) == (ref[m] == -1), m
    # evaluating on a subset ignores the other images' detections
    noisy = predictions(data, index, images, noise=0.3)
    mixed = perfect[:3] + noisy[3:]
    assert ev.evaluate(ids, mixed, eval_img_ids=ids[:3])['AP'] == \
        pytest.approx(1.0)
    assert ev.evaluate(ids[3:], noisy[3:]) == ev.evaluate(
        ids, mixed, eval_img_ids=ids[3:])


def test_errors(coco):
    ann, data, classes, index = coco
    ev = CocoEvaluator(ann, classes)
    with pytest.raises(ValueError, match='not in the annotation file'):
        ev.evaluate([-5], predictions(data, index, data['images'][:1], 0))
    with pytest.raises(ValueError, match='image ids for'):
        ev.evaluate([1, 2], [])
    with pytest.raises(ValueError, match='of the 3 classes'):
        CocoEvaluator(ann, ['person', 'car', 'no such class'])


def plain_cocoeval(ev, ids, preds):
    """COCOeval's six metrics with its four area ranges, on the categories
    with ground truth in these images (as ``CocoEvaluator`` evaluates)."""
    from mmdet.datasets.api_wrappers import COCOeval
    with_gt = set().union(*(ev._img_cats[i] for i in ids))
    cat_ids = [c for c in ev.cat_ids if c in with_gt]
    dets = ev.to_array(ids, preds)
    dets = dets[np.isin(dets[:, 6], cat_ids)]
    coco_eval = COCOeval(ev.coco, ev.coco.loadRes(dets), 'bbox')
    coco_eval.params.catIds = cat_ids
    coco_eval.params.imgIds = list(ids)
    coco_eval.params.maxDets = ev.proposal_nums
    assert len(coco_eval.params.areaRng) == 4
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return {
        k: float(v) if v > -1 else float('nan')
        for k, v in zip(METRICS, coco_eval.stats)
    }


def _same(ours, ref):
    for m in METRICS:
        assert (np.isnan(ours[m]) and np.isnan(ref[m])) or ours[m] == ref[m], m


def test_area_ranges_without_ground_truth_are_skipped_exactly(coco, tmp_path):
    ann, data, classes, index = coco
    ev = CocoEvaluator(ann, classes)
    from mmdet.datasets.api_wrappers import COCOeval
    params = COCOeval(iouType='bbox').params
    # real images: a range is kept exactly where a box of it is annotated
    for images in (data['images'][:10], data['images'][20:23],
                   data['images'][40:41]):
        ids = [img['id'] for img in images]
        anns = [a for a in data['annotations'] if a['image_id'] in ids]
        kept = ev.area_ranges(ids, [a['category_id'] for a in anns], params)
        for i, (lo, hi) in enumerate(params.areaRng):
            has = any(lo <= a['area'] <= hi for a in anns)
            assert (i in kept) == (has or i == 0), (i, ids)
        preds = predictions(data, index, images, noise=0.15)
        _same(ev.evaluate(ids, preds), plain_cocoeval(ev, ids, preds))
    # every box small (the context-shift benchmark's digits): two ranges of
    # four are evaluated, to the same figures
    small = dict(data)
    small['annotations'] = []
    for a in data['annotations']:
        x, y, w, h = a['bbox']
        scale = min(1.0, 30.0 / max(w, h))
        small['annotations'].append(
            dict(
                a,
                bbox=[x, y, w * scale, h * scale],
                area=w * h * scale * scale,
                segmentation=[]))
    path = tmp_path / 'small.json'
    path.write_text(json.dumps(small))
    ev = CocoEvaluator(str(path), classes)
    images = small['images'][:10]
    ids = [img['id'] for img in images]
    assert ev.area_ranges(ids, ev.cat_ids, params) == [0, 1]
    preds = predictions(small, index, images, noise=0.15)
    ours = ev.evaluate(ids, preds)
    assert 0.05 < ours['AP'] and np.isnan(ours['APm'])
    _same(ours, plain_cocoeval(ev, ids, preds))


def test_a_box_without_an_area_is_named(coco, tmp_path):
    ann, data, classes, _ = coco
    first = dict(data['annotations'][0])
    del first['area']
    broken = dict(data, annotations=[first] + data['annotations'][1:])
    path = tmp_path / 'no_area.json'
    path.write_text(json.dumps(broken))
    with pytest.raises(
            ValueError,
            match=f'no_area.json: annotation {first["id"]} of image '
            f'{first["image_id"]} has no numeric "area"'):
        CocoEvaluator(str(path), classes)
