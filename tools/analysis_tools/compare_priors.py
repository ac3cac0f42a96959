# Copyright (c) mmcalidet contributors. All rights reserved.
"""Compare two prior files: MAE, percentiles of |B - A|, the most changed
pairs by class name, and heatmaps of A, B and B - A. Example::

    python tools/analysis_tools/compare_priors.py \
        mmcalidet/data/priors/coco2017_train.json \
        mmcalidet/data/priors/coco2017_val.json --out-dir outputs/cmp
"""
import argparse
import json
import os
import os.path as osp

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.priors import load_prior
from mmcalidet.priors.compare import compare_priors, format_comparison
from mmcalidet.utils.cli import run_tool
from mmcalidet.utils.file_io import atomic_write
from mmcalidet.visualization import plot_prior, plot_prior_comparison


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Compare two priors')
    parser.add_argument('a', help='first prior file (.json or .npy)')
    parser.add_argument('b', help='second prior file')
    parser.add_argument('--out-dir', required=True,
                        help='folder for the report and heatmaps')
    parser.add_argument('--top', type=int, default=20,
                        help='number of most-changed pairs to list')
    parser.add_argument('--names', nargs=2, default=None,
                        metavar=('NAME_A', 'NAME_B'),
                        help='display names (default: the file names)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    a, meta_a = load_prior(args.a, return_meta=True)
    classes = meta_a['classes']
    # B is reordered by class name to A's order when both have names.
    b, meta_b = load_prior(args.b, classes=classes if classes and
                           _has_names(args.b) else None,
                           num_classes=a.shape[0], return_meta=True)
    names = args.names or [
        osp.splitext(osp.basename(args.a))[0],
        osp.splitext(osp.basename(args.b))[0]
    ]
    if names[0] == names[1]:
        names = [names[0] + ' (A)', names[1] + ' (B)']
    summary = compare_priors(a, b, classes, top=args.top)
    report = format_comparison(summary, names)
    os.makedirs(args.out_dir, exist_ok=True)
    with atomic_write(osp.join(args.out_dir, 'comparison.json')) as f:
        json.dump(dict(a=args.a, b=args.b, names=names, **summary), f,
                  indent=1)
    with atomic_write(osp.join(args.out_dir, 'comparison.md')) as f:
        f.write(report)
    plot_prior(a, osp.join(args.out_dir, 'prior_a.png'), names[0], classes)
    plot_prior(b, osp.join(args.out_dir, 'prior_b.png'), names[1], classes)
    plot_prior(b - a, osp.join(args.out_dir, 'diff_b_minus_a.png'),
               f'{names[1]} - {names[0]}', classes, diff=True)
    plot_prior_comparison(a, b, osp.join(args.out_dir, 'heatmaps.png'),
                          names, classes)
    print(report)
    print(f'wrote comparison.{{json,md}}, prior_a.png, prior_b.png, '
          f'diff_b_minus_a.png, heatmaps.png to {args.out_dir}')
    return 0


def _has_names(path: str) -> bool:
    return not path.endswith('.npy')


if __name__ == '__main__':
    run_tool(main)
