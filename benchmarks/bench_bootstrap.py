# Copyright (c) mmcalidet contributors. All rights reserved.
"""Speed of the paired bootstrap over images (what ``fit_site_prior``'s
``interval`` rule and the deployment rows pay per fitted prior).

On the coco-mini val annotations (79 images, 80 classes), detections are
the ground-truth boxes jittered plus false positives, with random scores
(no detector). One resample is the box AP of a multiset of the images;
this prints its cost through :class:`~mmcalidet.evaluation.ImageMatches`
(each image weighted by how often it is drawn) against a reference that
concatenates the drawn images' detections copy by copy, as COCOeval's
``accumulate`` would on a data set holding the copies, checks that both
give the same AP, checks that the draws scored all at once
(:meth:`~mmcalidet.evaluation.ImageMatches.ap_draws`, what
``paired_bootstrap`` runs) give those APs too, and times
``paired_bootstrap`` at its default 1000 resamples.

Usage::

    .venv/bin/python benchmarks/bench_bootstrap.py [--resamples 1000] \
        [--reference-draws 20]
"""
import argparse
import os.path as osp
import time

import numpy as np

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--data',
        default=osp.join(ROOT, '..', 'shared', 'datasets'),
        help='the shared datasets folder (holds coco-mini)')
    parser.add_argument(
        '--resamples', type=int, default=1000, help='bootstrap resamples')
    parser.add_argument(
        '--reference-draws',
        type=int,
        default=20,
        help='draws timed with the copy-by-copy reference')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def synthetic_detections(evaluator, rng):
    """Jittered ground-truth boxes plus one false positive per image."""
    from mmengine.structures import InstanceData
    cat_to_label = {c: k for k, c in enumerate(evaluator.cat_ids)}
    ids, results = [], []
    for img_id in evaluator.all_img_ids:
        anns = evaluator.coco.imgToAnns.get(img_id, [])
        boxes = np.array([[
            a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
            a['bbox'][1] + a['bbox'][3]
        ] for a in anns]).reshape(-1, 4)
        labels = np.array([cat_to_label[a['category_id']] for a in anns],
                          dtype=np.int64)
        false = np.array([[10.0, 10.0, 60.0, 60.0]])
        ids.append(img_id)
        results.append(
            InstanceData(
                bboxes=np.concatenate(
                    [boxes + rng.normal(0, 4, boxes.shape), false]),
                scores=rng.uniform(size=len(boxes) + 1),
                labels=np.concatenate(
                    [labels, [rng.integers(len(evaluator.cat_ids))]])))
    return ids, results


def reference_ap(coco_eval, positions, max_det):
    """COCOeval's ``accumulate`` (area all, ``max_det``) on the drawn
    images, copy by copy: the per-draw concatenation the weighted
    :meth:`ImageMatches.ap` replaces."""
    params = coco_eval.params
    num_imgs = len(params.imgIds)
    precisions = []
    for k in range(len(params.catIds)):
        entries = [coco_eval.evalImgs[k * num_imgs + i] for i in positions]
        entries = [e for e in entries if e is not None]
        npig = sum(int(np.count_nonzero(e['gtIgnore'] == 0)) for e in entries)
        if npig == 0:
            continue
        scores = np.concatenate([e['dtScores'][:max_det] for e in entries])
        order = np.argsort(-scores, kind='mergesort')
        matches = np.concatenate(
            [e['dtMatches'][:, :max_det] for e in entries], axis=1)
        matches = matches[:, order] > 0
        ignore = np.concatenate([e['dtIgnore'][:, :max_det] for e in entries],
                                axis=1)[:, order].astype(bool)
        tps = np.cumsum(matches & ~ignore, axis=1, dtype=np.float64)
        fps = np.cumsum(~matches & ~ignore, axis=1, dtype=np.float64)
        for tp, fp in zip(tps, fps):
            recall = tp / npig
            precision = tp / (fp + tp + np.spacing(1))
            precision = np.maximum.accumulate(precision[::-1])[::-1]
            q = np.zeros(len(params.recThrs))
            idx = np.searchsorted(recall, params.recThrs, side='left')
            valid = idx < len(precision)
            q[valid] = precision[idx[valid]]
            precisions.append(q.mean())
    return float(np.mean(precisions)) if precisions else float('nan')


def main():
    args = parse_args()
    from mmdet.datasets import CocoDataset

    from mmcalidet.evaluation import CocoEvaluator, paired_bootstrap
    ann = osp.join(args.data, 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    evaluator = CocoEvaluator(ann, list(CocoDataset.METAINFO['classes']))
    rng = np.random.default_rng(args.seed)
    ids, results = synthetic_detections(evaluator, rng)
    start = time.perf_counter()
    matches = evaluator.image_matches(ids, results)
    setup = time.perf_counter() - start
    # COCOeval sorts the image ids: positions of the reference are its own
    coco_eval = evaluator._cocoeval(
        sorted(ids), [results[ids.index(i)] for i in sorted(ids)],
        all_area_only=True)
    n = len(ids)
    draws = [rng.integers(0, n, size=n) for _ in range(args.reference_draws)]
    start = time.perf_counter()
    fast = [matches.ap(d) for d in draws]
    t_fast = (time.perf_counter() - start) / len(draws)
    start = time.perf_counter()
    stacked = matches.ap_draws(np.stack(draws))
    t_stacked = (time.perf_counter() - start) / len(draws)
    where = {img_id: i for i, img_id in enumerate(sorted(ids))}
    start = time.perf_counter()
    slow = [
        reference_ap(coco_eval, [where[ids[p]] for p in d], matches.max_det)
        for d in draws
    ]
    t_slow = (time.perf_counter() - start) / len(draws)
    diff = float(np.max(np.abs(np.subtract(fast, slow))))
    diff_stacked = float(np.max(np.abs(np.subtract(stacked, slow))))
    print(f'{n} images, {len(evaluator.cat_ids)} classes; matching once: '
          f'{setup:.1f} s')
    print(f'one resample: weighted {1e3 * t_fast:.1f} ms, copy by copy '
          f'{1e3 * t_slow:.1f} ms ({t_slow / t_fast:.1f}x); largest AP '
          f'difference over {len(draws)} draws: {diff:.1e}')
    print(f'all {len(draws)} draws at once: {1e3 * t_stacked:.2f} ms per '
          f'resample ({t_fast / t_stacked:.1f}x one by one); largest AP '
          f'difference to copy by copy: {diff_stacked:.1e}, to one by one: '
          f'{float(np.max(np.abs(np.subtract(stacked, fast)))):.1e}')
    start = time.perf_counter()
    out = paired_bootstrap(matches, matches, resamples=args.resamples)
    print(f'paired_bootstrap, {out["resamples"]} resamples of 2 methods: '
          f'{time.perf_counter() - start:.2f} s')
    return 0 if max(diff, diff_stacked) < 1e-9 else 1


if __name__ == '__main__':
    raise SystemExit(main())
