# Copyright (c) mmcalidet contributors. All rights reserved.
"""Compute a relation prior E (E[i, j] = P(i | j)) from dataset labels.

SRC is a COCO annotation JSON (crowd annotations ignored), a folder of
YOLO-format label files, or a ``.tar.gz`` of them (streamed, not
extracted). Example::

    python tools/analysis_tools/compute_prior.py \
        ../shared/datasets/coco2017-labels/labels_train2017.tar.gz \
        --classes ../shared/datasets/coco2017-labels/classes.json \
        --out coco2017_train.json
"""
import argparse
import os
import os.path as osp
import time

import numpy as np

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.priors import save_prior
from mmcalidet.priors.dataset_prior import prior_from_source
from mmcalidet.utils.cli import non_negative_int, run_tool
from mmcalidet.utils.file_io import check_writable_file


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Compute a relation prior from dataset labels')
    parser.add_argument(
        'src', help='COCO annotation .json, folder of YOLO .txt label '
        'files, or a .tar.gz of them')
    parser.add_argument('--out', required=True, help='prior file to write '
                        '(.json with class names, or .npy)')
    parser.add_argument(
        '--classes', help='classes file (JSON list of names, JSON list of '
        '{"index", "name"}, or one name per line); required for YOLO '
        'labels, optional for COCO JSON (reorders by name)')
    parser.add_argument(
        '--decimals',
        type=non_negative_int,
        default=None,
        help='round stored values to this many (>= 0) decimals (default: '
        'full precision)')
    parser.add_argument('--no-progress', action='store_true',
                        help='do not show a progress bar')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    check_writable_file(args.out, '--out')  # before the labels are read
    start = time.perf_counter()
    matrix, counts, sets = prior_from_source(args.src, args.classes,
                                             not args.no_progress)
    classes = sets.classes
    save_prior(
        args.out,
        matrix,
        classes,
        decimals=args.decimals,
        source=osp.basename(osp.normpath(args.src)),
        num_images=sets.num_images,
        images_with_labels=int(np.count_nonzero(np.diff(sets.offsets))),
        images_per_class={c: int(n) for c, n in zip(classes, counts)},
        definition='E[i][j] = P(class i present | class j present); 0.5 '
        'where class j never occurs; diagonal 1')
    outside = sets.extra.get('outside_classes', 0)
    print(f'wrote {args.out}: K={len(classes)}, {sets.num_images} images '
          f'({np.count_nonzero(np.diff(sets.offsets))} with labels), '
          + (f'{outside} annotations of categories outside --classes left '
             'out, ' if outside else '') +
          f'{time.perf_counter() - start:.2f} s')
    return 0


if __name__ == '__main__':
    run_tool(main)
