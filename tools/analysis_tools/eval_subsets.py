# Copyright (c) mmcalidet contributors. All rights reserved.
"""Subset evaluation (the paper's Tab. 3): split the evaluation set into
equal, non-overlapping, seeded random subsets of each size; per subset
inject E_b(subset) vs E_t; COCO metrics averaged per size, with
epsilon = mean MAE(E_b, E_t) and the gains.

    python tools/analysis_tools/eval_subsets.py CONFIG CHECKPOINT \
        [--sizes 8 16 32 64 128 256] [--seed 0] \
        [--baseline-config DINO_CONFIG --baseline-checkpoint DINO_CKPT] \
        --out-dir work_dirs/eval_subsets

epsilon only (no model), e.g. on the image-level labels of COCO val2017::

    L=../shared/datasets/coco2017-labels
    python tools/analysis_tools/eval_subsets.py --epsilon-only \
        --labels $L/labels_val2017.tar.gz --classes $L/classes.json \
        --image-list $L/val2017_image_sizes.json --out-dir work_dirs/eps

Writes ``subsets.md``, ``subsets.json`` and ``subsets.png``.
"""
import argparse
import os.path as osp
import sys
import time

from mmcalidet.evaluation import (METRICS, SUBSET_SIZES, cache_evaluator,
                                  evaluate_subsets, markdown_table,
                                  read_evaluation_labels, subset_epsilon,
                                  write_report)
from mmcalidet.evaluation.report import fmt_value, metric_columns
from mmcalidet.utils.cli import run_tool
from mmcalidet.visualization import plot_subset_results

# the tools' shared options, beside this file
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from eval_options import add_model_args, ensure_out_dir, eval_setup

SPLIT = ('perm = numpy.random.default_rng({seed}).permutation(N); the '
         'subsets of size s are perm[k*s:(k+1)*s] for k < N // s (the '
         'remainder is left out).')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Subset evaluation: E_b(subset) vs E_t')
    parser.add_argument('config', nargs='?', help='CaliDet config')
    parser.add_argument('checkpoint', nargs='?', help='its checkpoint')
    parser.add_argument(
        '--sizes',
        type=int,
        nargs='+',
        default=list(SUBSET_SIZES),
        help='subset sizes')
    parser.add_argument('--seed', type=int, default=0, help='split seed')
    parser.add_argument(
        '--epsilon-only',
        action='store_true',
        help='compute only epsilon from labels (no model)')
    parser.add_argument(
        '--labels',
        help='--epsilon-only: COCO annotation JSON, YOLO label folder or '
        '.tar.gz')
    parser.add_argument(
        '--classes', help='--epsilon-only: classes file (YOLO labels)')
    parser.add_argument(
        '--image-list',
        help='--epsilon-only: all image names (e.g. '
        'val2017_image_sizes.json); unlabelled ones are appended as '
        'images with no object')
    add_model_args(parser)
    args = parser.parse_args(argv)
    if any(s < 1 for s in args.sizes):
        parser.error('--sizes must be >= 1')
    if args.epsilon_only:
        if not args.labels:
            parser.error('--epsilon-only needs --labels')
    elif not (args.config and args.checkpoint):
        parser.error('pass CONFIG and CHECKPOINT (or --epsilon-only)')
    return args


def epsilon_only(args) -> int:
    import numpy as np

    from mmcalidet.priors.prior import Prior
    label_lists, names, classes = read_evaluation_labels(
        args.labels, args.classes, args.image_list)
    src = args.train_prior or 'coco2017_train'
    train_prior = np.array(Prior.load(src, classes, len(classes)).matrix)
    rows = subset_epsilon(
        label_lists,
        train_prior,
        args.sizes,
        args.seed,
        progress=not args.no_progress)
    table = markdown_table(rows, [('size', 'subset size', ''),
                                  ('num_subsets', 'subsets', ''),
                                  ('epsilon', 'epsilon', '.3f'),
                                  ('epsilon_std', 'std over subsets', '.3f')])
    empty = sum(len(x) == 0 for x in label_lists)
    how = (f'{len(label_lists)} images from {args.labels} ({empty} without '
           f'objects), {len(classes)} classes, E_t = {src}. Images in the '
           'order of the label source' +
           (', then the unlabelled images of the image list sorted by name'
            if args.image_list else '') + '. ' + SPLIT.format(seed=args.seed))
    out_dir = ensure_out_dir(args.out_dir)
    paths = write_report(
        out_dir, 'subsets', 'Subset epsilon = MAE(E_b, E_t)',
        [(None, table), ('How the subsets were made', how)],
        dict(
            rows=rows,
            num_images=len(label_lists),
            images_without_objects=empty,
            labels=args.labels,
            train_prior=src,
            seed=args.seed))
    paths.append(
        plot_subset_results([],
                            osp.join(out_dir, 'subsets.png'),
                            epsilon_rows=rows))
    print(table)
    print('wrote ' + ', '.join(paths))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.epsilon_only:
        return epsilon_only(args)
    out_dir = ensure_out_dir(args.out_dir)
    start = time.perf_counter()
    setup = eval_setup(args)
    if not any(m.takes_prior for m in setup.methods):
        raise ValueError('no detector takes a prior: pass a CaliDet '
                         'checkpoint or post-hoc corrections')
    cached = time.perf_counter()
    rows = evaluate_subsets(
        setup.methods,
        cache_evaluator(setup.evaluator),
        setup.train_prior,
        args.sizes,
        args.seed,
        progress=not args.no_progress)
    done = time.perf_counter()
    display = []
    for r in rows:
        display.append(dict(r))
        if r.get('prior') == 'E_b':
            display.append(
                dict(
                    prior='gain',
                    **{m: fmt_value(r[f'gain_{m}'], 'gain')
                       for m in METRICS}))
    columns = [('size', 'size', ''), ('num_subsets', 'subsets', ''),
               ('method', 'method', ''), ('prior', 'prior', ''),
               ('epsilon', 'epsilon', '.3f')] + metric_columns()
    table = markdown_table(display, columns)
    skipped = [s for s in args.sizes if s > len(setup.cache)]
    how = (f'{len(setup.cache)} images of the test set in dataset order. ' +
           SPLIT.format(seed=args.seed) +
           ' Metrics are averaged over the subsets of a size (subsets '
           'where a metric is undefined, e.g. no small object, are left '
           'out of that metric\'s mean). Gains are E_b minus E_t, x100.')
    if skipped:
        how += f' Sizes {skipped} exceed the number of images.'
    timing = (f'cache pass {cached - start:.1f} s, subset evaluations '
              f'{done - cached:.1f} s.')
    paths = write_report(
        out_dir, 'subsets', 'Subset evaluation: E_b vs E_t',
        [(None, table), ('How the subsets were made', how), ('Run', timing)],
        dict(rows=rows, info=setup.info, seed=args.seed, sizes=args.sizes))
    paths.append(plot_subset_results(rows, osp.join(out_dir, 'subsets.png')))
    print(table)
    print(timing)
    print('wrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    run_tool(main)
