# Copyright (c) mmcalidet contributors. All rights reserved.
"""Generate the context-shift benchmark (COCO format), deterministic by
seed. Example::

    export PYTHONPATH=$PWD:$PYTHONPATH  # from the repository root
    python projects/context_shift/tools/make_data.py \
        --out data/context_shift --seed 0

Writes ``images/{train,val}/``, ``annotations/instances_train.json``,
``instances_val_<site>.json`` and ``instances_val.json`` (all sites),
``priors/E_t.json`` and ``E_<site>.json``, ``classes.txt`` and
``meta.json`` (knobs, per-image class statistics of every split, and
epsilon = mean |E_site - E_t| per site). The scene model (scene types,
mixtures, sites) can be replaced with ``--scenes FILE.json``; see
the project's README.md. Everything is written to ``OUT.partial`` and
renamed to ``OUT`` at the end: a failed run (e.g. a full disk) removes
it, and the next run removes one that a killed run left.

``--variant many-class`` makes the variant whose class statistics look like
COCO's (40 digit x colour style classes, 2-4 distinct per image)::

    python projects/context_shift/tools/make_data.py \
        --out data/context_shift_many-class --variant many-class --seed 0
"""
import argparse
import os
import os.path as osp
import re

# images and annotations only: skip registering the models (see
# mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

import sys

try:
    from projects.context_shift.context_shift.data import (VARIANTS,
                                                           make_context_shift)
    from projects.context_shift.context_shift.data_writer import \
        remove_leftovers
except ImportError as exc:  # not run from the root with it on PYTHONPATH
    sys.exit(f'make_data.py: error: {exc}; run it from the repository root '
             'with export PYTHONPATH=$PWD:$PYTHONPATH')
from mmcalidet.utils.cli import finite_float, positive_int, run_tool, seed_int
from mmcalidet.utils.file_io import load_json


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Generate the context-shift benchmark')
    parser.add_argument('--out', required=True, help='folder to create')
    parser.add_argument(
        '--variant',
        choices=VARIANTS,
        default='digits',
        help='digits: 10 classes, 2-6 objects per image (the default); '
        'many-class: 40 digit x colour style classes, 2-4 distinct per '
        'image (class statistics like COCO\'s)')
    parser.add_argument('--seed', type=seed_int, default=0)
    parser.add_argument('--num-train', type=positive_int, default=2000)
    parser.add_argument('--num-val-per-site', type=positive_int, default=300)
    parser.add_argument('--img-size', type=positive_int, default=128)
    parser.add_argument('--digit-size', type=positive_int, nargs=2,
                        default=[14, 22], metavar=('MIN', 'MAX'))
    parser.add_argument('--objects', type=positive_int, nargs=2,
                        metavar=('MIN', 'MAX'),
                        help='objects per image (default 2 6; many-class: '
                        '2 4)')
    parser.add_argument('--noise-std', type=finite_float(0), default=0.12)
    parser.add_argument(
        '--hue-jitter',
        type=finite_float(0),
        help='many-class only: std of each object\'s hue around its '
        'style\'s, in degrees (default 8; the look-alike styles are 12 '
        'apart)')
    parser.add_argument('--scenes', help='JSON scene model (see '
                        'context_shift.data.DEFAULT_SCENES '
                        'and MANY_CLASS_SCENES)')
    parser.add_argument(
        '--validation-sites',
        action='store_true',
        help='a folder for choosing a training recipe: the val split is '
        'simulated sites (defined from the training labels) on '
        '8 x --num-val-per-site new images of the training mixture, not '
        'the deployment sites (context_shift.simulated_sites.'
        'make_validation_data)')
    parser.add_argument('--overwrite', action='store_true')
    parser.add_argument('--no-progress', action='store_true')
    args = parser.parse_args(argv)
    for option, pair in (('--digit-size', args.digit_size),
                         ('--objects', args.objects)):
        if pair and pair[0] > pair[1]:
            parser.error(f'argument {option}: MIN must not exceed MAX, got '
                         f'{pair[0]} {pair[1]}')
    return args


#: what a site may be called: it names files and folders of the output
SITE_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]*$')


def check_site_names(scenes) -> None:
    """Refuse site names that are not plain file-name parts (they name
    ``instances_val_<site>.json`` and ``E_<site>.json``), before anything
    is written.

    Raises:
        ValueError: naming ``--scenes`` and the site.
    """
    sites = (scenes.get('sites') if isinstance(scenes, dict) else None) or {}
    if not isinstance(sites, dict):
        raise ValueError('--scenes: "sites" must map site names to specs')
    for name in sites:
        if not isinstance(name, str) or not SITE_NAME.match(name) or \
                '..' in name:
            raise ValueError(
                f'--scenes: site name {name!r} must be letters, digits, '
                '"_", "-" or "." (it names output files)')


def main(argv=None):
    args = parse_args(argv)
    # what a failed or killed run left (OUT.partial), before anything else
    remove_leftovers(osp.abspath(args.out))
    scenes = None
    if args.scenes:
        scenes = load_json(args.scenes, 'scene model')
        check_site_names(scenes)
    knobs = dict(
        num_train=args.num_train, img_size=args.img_size,
        digit_size=tuple(args.digit_size),
        objects=tuple(args.objects) if args.objects else None,
        noise_std=args.noise_std, scenes=scenes, overwrite=args.overwrite,
        progress=not args.no_progress, variant=args.variant,
        hue_jitter=args.hue_jitter)
    if args.validation_sites:
        from projects.context_shift.context_shift.simulated_sites import \
            make_validation_data
        meta = make_validation_data(
            args.out, seed=args.seed,
            pool_size=8 * args.num_val_per_site,
            per_site=args.num_val_per_site, **knobs)
    else:
        meta = make_context_shift(
            args.out, seed=args.seed,
            num_val_per_site=args.num_val_per_site, **knobs)
    print(f'wrote {args.out} ({meta["variant"]}, {meta["num_classes"]} '
          f'classes): {meta["num_train"]} train images, '
          f'{meta["num_val_per_site"]} val images per site')
    for site, spec in meta.get('validation_sites', {}).items():
        print(f'  {site}: {spec["images"]} images, {spec["rule"]}')
    for split, stats in meta['statistics'].items():
        print(f'  {split}: {stats["classes_per_image"]:.2f} of '
              f'{meta["num_classes"]} classes per image '
              f'({stats["ex_columns_off_e0"]:.1%} of E_x\'s columns off E0), '
              f'{stats["objects_per_image"]:.2f} objects')
    for site, eps in meta['epsilon'].items():
        print(f'  epsilon(E_{site}, E_t) = {eps:.3f}')
    return 0


if __name__ == '__main__':
    run_tool(main)
