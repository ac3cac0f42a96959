# Copyright (c) mmcalidet contributors. All rights reserved.
"""The headroom table: per site, what its statistics can pay the plain
detector (:mod:`projects.context_shift.context_shift.headroom`): the
co-occurrence rescoring's and the re-weighting's sweep points and two
oracles, each fitted on one half of the site's labelled images and scored
on the other (split-half, with 90 % intervals). Run from the repository
root, on a benchmark's trained DINO::

    export PYTHONPATH=$PWD:$PYTHONPATH
    python projects/context_shift/tools/headroom.py \\
        work_dirs/context_shift/dino/dino_tiny_context-shift.py \\
        work_dirs/context_shift/dino/iter_600.pth \\
        --data data/context_shift --out outputs/headroom.md

The config is the one the training dumped in its work folder (its data
folder is the benchmark's). Writes the table (Markdown, with the date,
machine and command) and its JSON beside it.
"""
import argparse
import json
import os
import os.path as osp
import platform
import sys
import time

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmcalidet.utils.cli import run_tool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Per-site headroom of the plain detector')
    parser.add_argument('config', help='the plain detector\'s config')
    parser.add_argument('checkpoint', help='its checkpoint')
    parser.add_argument(
        '--data',
        required=True,
        help='the benchmark data folder (its val sites)')
    parser.add_argument(
        '--cache-dir',
        help='keep the decoder caches here (reused by a later run of this '
        'tool or of the other measurement tool on the same checkpoint)')
    parser.add_argument(
        '--out', required=True, help='the Markdown table to write (and .json)')
    parser.add_argument('--no-progress', action='store_true')
    return parser.parse_args(argv)


COLUMNS = (('site', 'site', ''), ('images', 'images', ''),
           ('epsilon', 'epsilon', '.3f'), ('base', 'AP at E_t', '.2f'),
           ('cooccurrence', 'co-occurrence rescoring',
            '+.2f'), ('cooccurrence_interval', '90 % interval',
                      ''), ('cooccurrence_alpha', 'alpha (fitted per half)',
                            ''), ('reweight', 're-weighting', '+.2f'),
           ('reweight_interval', '90 % interval',
            ''), ('reweight_alpha', 'alpha (fitted per half)',
                  ''), ('bias', 'oracle: per-class bias',
                        '+.2f'), ('bias_interval', '90 % interval', ''),
           ('relation', 'oracle: relation term',
            '+.2f'), ('relation_interval', '90 % interval', ''))


def display_rows(rows):
    """The rows with their intervals and per-half alphas as text."""
    from mmcalidet.evaluation.report import fmt_interval
    out = []
    for r in rows:
        d = dict(r)
        for key, value in r.items():
            if key.endswith('_interval'):
                d[key] = fmt_interval(value, '+.2f')
            elif key.endswith('_alpha'):
                d[key] = ' / '.join(f'{a:g}' for a in value)
        out.append(d)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault('MMCALIDET_CS_DATA', osp.abspath(args.data))
    from mmcalidet.evaluation import (EvalSetup, markdown_table,
                                      read_image_groups, site_priors)
    from mmcalidet.evaluation.partitions import group_partitions
    from mmcalidet.utils.log_level import library_output_to
    from projects.context_shift.context_shift.evaluation import SITES
    from projects.context_shift.context_shift.headroom import headroom_rows
    start = time.perf_counter()
    print(f'scoring {args.checkpoint} on {args.data} ...', flush=True)
    with library_output_to(os.devnull):
        setup = EvalSetup(
            args.config,
            args.checkpoint,
            posthoc=['reweight', 'cooccurrence'],
            train_prior=osp.join(args.data, 'priors', 'E_t.json'),
            cache_dir=args.cache_dir,
            progress=not args.no_progress)
    cache = setup.cache
    groups = read_image_groups(
        osp.join(args.data, 'annotations', 'instances_val.json'),
        cache.img_ids())
    order = [s for s in SITES if s in set(groups)
             ] + sorted(set(groups) - set(SITES))
    parts = group_partitions(groups, order)
    priors = site_priors(cache.gt_label_lists(), groups,
                         len(setup.train_prior), order)
    rows = headroom_rows(
        setup,
        groups,
        priors,
        parts,
        progress=lambda site: print(f'  {site} ...', flush=True))
    table = markdown_table(display_rows(rows), COLUMNS) + (
        '\n\nSplit-half: each site split by image parity; what a figure '
        'fits (alpha, an oracle) is fitted on one half with its statistics '
        'and scored on the other, each half its own AP, the two gains '
        'averaged; 90 % paired bootstrap intervals over images.')
    command = 'python projects/context_shift/tools/headroom.py ' + ' '.join(
        sys.argv[1:] if argv is None else argv)
    header = (f'{time.strftime("%Y-%m-%d")}, {platform.machine()} '
              f'({os.cpu_count()} cores), `{command}` '
              f'({time.perf_counter() - start:.0f} s)')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        f.write(f'{header}\n\n{table}\n')
    with open(osp.splitext(args.out)[0] + '.json', 'w') as f:
        json.dump(dict(rows=rows, command=command), f, indent=1)
    print(table)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    run_tool(main)
