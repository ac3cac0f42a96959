# Copyright (c) mmcalidet contributors. All rights reserved.
"""Main demo: COCO 2017 relation statistics from the bundled labels.

Computes E_t (train2017) and E_v (val2017) from the image-level YOLO label
tarballs, prints the figures the paper quotes next to ours, checks them
against the priors shipped in ``mmcalidet/data/priors``, and writes prior
files, a Markdown/JSON report and heatmaps (E_t, E_v, E_v - E_t) to
``--out-dir``. Run through ``make demo``.
"""
import argparse
import json
import os
import os.path as osp
import time

import numpy as np

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.priors import (default_prior_path, load_prior, prior_mae,
                              save_prior)
from mmcalidet.priors.compare import compare_priors, format_comparison
from mmcalidet.priors.dataset_prior import prior_from_source
from mmcalidet.utils.cli import run_tool
from mmcalidet.utils.file_io import atomic_write
from mmcalidet.visualization import plot_prior_comparison

#: the paper's figures (Sec. 1, Fig. "pcolor-e")
PAPER = {
    'P(person | baseball glove), train': 0.990,
    'MAE(E_v, E_t)': 0.008,
    'p50 |E_v - E_t|': 0.003,
    'p90 |E_v - E_t|': 0.021,
    'p97 |E_v - E_t|': 0.044,
    'p100 |E_v - E_t|': 0.272,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data', default=os.environ.get(
        'MMCALIDET_DATA', '../shared/datasets'), help='datasets folder')
    parser.add_argument('--out-dir', default='outputs/demo')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    labels = osp.join(args.data, 'coco2017-labels')
    classes_file = osp.join(labels, 'classes.json')
    os.makedirs(args.out_dir, exist_ok=True)
    priors, timings = {}, {}
    for split in ('train2017', 'val2017'):
        start = time.perf_counter()
        prior, counts, sets = prior_from_source(
            osp.join(labels, f'labels_{split}.tar.gz'), classes_file)
        timings[split] = time.perf_counter() - start
        priors[split] = prior
        save_prior(osp.join(args.out_dir, f'coco2017_{split[:-4]}.json'),
                   prior, sets.classes, source=f'labels_{split}.tar.gz',
                   num_images=sets.num_images)
        print(f'{split}: {sets.num_images} label files, '
              f'{sets.labels.size} boxes, {timings[split]:.2f} s')
    classes = sets.classes
    e_t, e_v = priors['train2017'], priors['val2017']
    summary = compare_priors(e_t, e_v, classes)
    pct = summary['percentiles']
    ours = {
        'P(person | baseball glove), train':
        e_t[classes.index('person'), classes.index('baseball glove')],
        'MAE(E_v, E_t)': summary['mae'],
        'p50 |E_v - E_t|': pct['50'],
        'p90 |E_v - E_t|': pct['90'],
        'p97 |E_v - E_t|': pct['97'],
        'p100 |E_v - E_t|': pct['100'],
    }
    lines = ['| quantity | paper | mmcalidet (80 classes) |',
             '|---|---|---|']
    lines += [
        f'| {k.replace("|", chr(92) + "|")} | {PAPER[k]:.3f} | '
        f'{ours[k]:.4f} |' for k in PAPER
    ]
    table = '\n'.join(lines)
    print('\n' + table + '\n')
    shipped = {}
    for split in ('train', 'val'):
        ref = load_prior(default_prior_path(f'coco2017_{split}'),
                         classes=classes)
        ours_ = e_t if split == 'train' else e_v
        shipped[split] = prior_mae(ref, ours_)
        print(f'shipped coco2017_{split}.json vs recomputed: max |diff| = '
              f'{np.abs(ref - ours_).max():.2e}')
    with atomic_write(osp.join(args.out_dir, 'report.md')) as f:
        f.write('# COCO 2017 relation statistics\n\n' + table + '\n\n' +
                format_comparison(summary, ('E_t', 'E_v')))
    with atomic_write(osp.join(args.out_dir, 'report.json')) as f:
        json.dump(dict(paper=PAPER, ours=ours, timings_s=timings,
                       comparison=summary), f, indent=1)
    png = plot_prior_comparison(e_t, e_v,
                                osp.join(args.out_dir, 'heatmaps.png'),
                                ('E_t (train2017)', 'E_v (val2017)'))
    print(f'wrote priors, report.md, report.json and {png}')
    return 0


if __name__ == '__main__':
    run_tool(main)
