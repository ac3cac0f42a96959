# Copyright (c) mmcalidet contributors. All rights reserved.
"""Fit a deployment site's prior from a few of its labelled images, so that
injecting it cannot be expected to hurt.

    python tools/analysis_tools/fit_site_prior.py CONFIG CHECKPOINT \\
        --site-ann site/annotations.json --site-img-dir site/images \\
        --out site_fitted.json

The detector runs once over the site's labelled images (8 to 128 are
enough; their decoder outputs are cached), then
:func:`~mmcalidet.calibration.fit_site_prior` picks how far to move from
E_t toward the site's statistics, ``E_t + alpha (E_site - E_t)``, by
cross-validation on those images (each image scored by a prior estimated
without it), and keeps E_t unless the best candidate's gain is above 0
with its whole 95 % interval (``--accept gain``: above 0). The prior file
records n, alpha and the cross-validated AP gain over E_t with its paired
bootstrap 95 % interval. With ``--baseline-config`` the plain detector's
post-hoc corrections are fitted the same way and reported beside it.
``--out-dir`` (default ``./work_dirs/<config file stem>``, where
``tools/train.py`` and ``tools/test.py`` put theirs) gets
``site_prior.md`` / ``.json`` (every candidate) and ``eval.log`` (what the
libraries printed). A fit that fails writes nothing: no prior, no report,
no log (a log that was there is left as it was). A site annotation file
that is not JSON, or holds no images, is one line naming it.
"""
import argparse
import os.path as osp
import sys
import time

from mmcalidet.calibration import (ACCEPT, ALPHAS, DEFAULT_ACCEPT,
                                   fit_site_prior)
from mmcalidet.evaluation import markdown_table, write_report
from mmcalidet.priors.label_io import coco_label_sets
from mmcalidet.priors.shrinkage import ABSENT
from mmcalidet.utils.cli import bounded_int, finite_float, run_tool, seed_int
from mmcalidet.utils.file_io import check_writable_file, load_json

# the tools' shared options, beside this file
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from eval_options import (add_model_args, check_out_dir, ensure_out_dir,
                          eval_setup, nothing_left_on_failure)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Fit a site prior from a few labelled site images')
    parser.add_argument('config', help='CaliDet config')
    parser.add_argument('checkpoint', help='its checkpoint')
    parser.add_argument(
        '--site-ann',
        help='COCO annotation file of the site\'s labelled images (default: '
        'the config\'s test set)')
    parser.add_argument(
        '--site-img-dir', help='their image folder (with --site-ann)')
    parser.add_argument(
        '--out', required=True, help='the fitted prior file (.json)')
    parser.add_argument(
        '--alphas',
        nargs='+',
        type=finite_float(0.0, 2.0),
        default=list(ALPHAS),
        help=f'shrinkage candidates, > 0 ({" ".join(map(str, ALPHAS))})')
    parser.add_argument(
        '--absent',
        nargs='+',
        choices=ABSENT,
        default=list(ABSENT),
        help='estimates of the columns of classes the images never show: '
        'E_t\'s (train) or flat 0.5 (flat); both by default')
    parser.add_argument(
        '--accept',
        choices=ACCEPT,
        default=DEFAULT_ACCEPT,
        help='when the best candidate replaces E_t: "interval" (the '
        'default), the low end of its CV gain\'s 95 %% interval is above '
        '0; "gain", the gain is')
    parser.add_argument(
        '--folds', type=bounded_int(2, 64), default=4, help='CV folds (4)')
    parser.add_argument(
        '--resamples',
        type=bounded_int(10, 100000),
        default=1000,
        help='bootstrap resamples of the interval (1000)')
    parser.add_argument(
        '--seed', type=seed_int, default=0, help='folds and bootstrap seed')
    add_model_args(parser)
    # the output folder of mmdet's tools: ./work_dirs/<config file stem>
    parser.set_defaults(out_dir=None)
    for action in parser._actions:
        if action.dest == 'out_dir':
            action.help = ('where to write the report and eval.log '
                           '(default ./work_dirs/<config file stem>)')
    args = parser.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = default_out_dir(args.config)
    if bool(args.site_ann) != bool(args.site_img_dir):
        parser.error('give --site-ann and --site-img-dir together')
    if any(a <= 0 for a in args.alphas):
        parser.error('--alphas must be > 0 (0 is E_t, the fallback)')
    if not args.out.endswith('.json'):
        parser.error('--out must be a .json prior file (it names classes)')
    return args


def default_out_dir(config: str) -> str:
    """The default output folder, as ``tools/train.py`` and
    ``tools/test.py`` name theirs.

    Args:
        config (str): the config file.

    Returns:
        str: ``./work_dirs/<config file stem>``.
    """
    return osp.join('./work_dirs', osp.splitext(osp.basename(config))[0])


def check_site_annotations(path: str) -> None:
    """Refuse a site annotation file that cannot be fitted from: not JSON
    (e.g. truncated), not a COCO file, without images, or one that
    ``compute_prior.py`` refuses (duplicated image ids, a box that is not
    finite numbers >= 0: :func:`~mmcalidet.priors.label_io.
    coco_label_sets`).

    Args:
        path (str): the ``--site-ann`` file.

    Raises:
        ValueError: one line naming the file and the problem.
    """
    coco = load_json(path, '--site-ann annotation file')
    images = coco.get('images') if isinstance(coco, dict) else None
    if not isinstance(images, list):
        raise ValueError(f'--site-ann annotation file {path} is not a COCO '
                         'annotation file (no "images" list)')
    if not images:
        raise ValueError(f'--site-ann annotation file {path} holds no '
                         'images: a site prior is fitted from labelled '
                         'images of the site')
    # compute_prior.py's checks of a COCO file: duplicated ids, unknown
    # ids, boxes that are not finite numbers >= 0
    try:
        coco_label_sets(coco, path)
    except ValueError as exc:
        raise ValueError(f'--site-ann annotation file {exc}') from None


def site_options(args: argparse.Namespace) -> None:
    """Point the config's test set and evaluator at the site's images.

    Raises:
        ValueError: a site file or folder that is missing, or an
            annotation file that is not JSON or holds no images
            (:func:`check_site_annotations`).
    """
    if not args.site_ann:
        return
    for what, path in (('--site-ann', args.site_ann), ('--site-img-dir',
                                                       args.site_img_dir)):
        if not osp.exists(path):
            raise ValueError(f'{what} not found: {path}')
    if not osp.isdir(args.site_img_dir):
        raise ValueError(f'--site-img-dir is not a folder: '
                         f'{args.site_img_dir}')
    check_site_annotations(args.site_ann)
    ann = osp.abspath(args.site_ann)
    options = {
        'test_dataloader.dataset.data_root':
        '',
        'test_dataloader.dataset.ann_file':
        ann,
        'test_dataloader.dataset.data_prefix':
        dict(img=osp.abspath(args.site_img_dir) + '/'),
        'test_evaluator.ann_file':
        ann,
    }
    args.cfg_options = dict(args.cfg_options or {}, **options)


def main(argv=None) -> int:
    args = parse_args(argv)
    # what the run writes, checked before the detector pass
    check_out_dir(args.out_dir)
    check_writable_file(args.out, '--out')
    site_options(args)
    with nothing_left_on_failure(args.out_dir):
        return fit_and_write(args)


def fit_and_write(args: argparse.Namespace) -> int:
    """Fit the site prior and write it with its report (``main`` once the
    inputs are checked).

    Args:
        args (argparse.Namespace): the parsed options.

    Returns:
        int: 0.

    Raises:
        ValueError: the detector is not a CaliDet detector, or the site
            has no images.
    """
    out_dir = ensure_out_dir(args.out_dir)
    start = time.perf_counter()
    setup = eval_setup(args)
    methods = [m for m in setup.methods if m.takes_prior]
    if not methods or not methods[0].rescorer.calibratable:
        raise ValueError(f'{args.config} is not a CaliDet detector: its '
                         'prior cannot be fitted')
    if not len(setup.cache):
        site = args.site_ann or f"{args.config}'s test set"
        raise ValueError(f'the site ({site}) has no images: a site prior '
                         'is fitted from labelled images')
    print(
        f'fitting on {len(setup.cache)} labelled site images '
        f'({args.folds} folds) ...',
        flush=True)
    fits, rows = {}, []
    for method in methods:
        fit = fit_site_prior(
            method.rescorer,
            setup.evaluator,
            setup.train_prior,
            alphas=args.alphas,
            absent=args.absent,
            folds=args.folds,
            resamples=args.resamples,
            seed=args.seed,
            accept=args.accept)
        fits[method.name] = fit
        rows.append(
            dict(
                method=method.name,
                alpha=fit.alpha,
                absent=fit.absent if fit.alpha else '-',
                gain=fit.gain,
                interval=f'[{fit.low:+.2f}, {fit.high:+.2f}]'))
    main_fit = fits[methods[0].name]
    table = markdown_table(rows, [('method', 'method', ''),
                                  ('alpha', 'alpha', '.2f'),
                                  ('absent', 'absent columns', ''),
                                  ('gain', 'CV gain over E_t (AP)', '+.2f'),
                                  ('interval', '95 % interval', '')])
    candidates = markdown_table([
        dict(method=name, **row) for name, fit in fits.items()
        for row in fit.table
    ], [('method', 'method', ''), ('absent', 'absent columns', ''),
        ('alpha', 'alpha', '.2f'), ('gain', 'CV gain (AP)', '+.2f')])
    how = (f'{main_fit.num_images} images, {main_fit.folds} folds (seed '
           f'{args.seed}): each image is scored under E_t + alpha (E_site - '
           'E_t) with E_site estimated from the other folds; the candidate '
           'of the largest AP gain over E_t on all images wins, E_t '
           '(alpha 0) when none gains. The interval is a paired bootstrap '
           f'over the images ({args.resamples} resamples).')
    paths = write_report(
        out_dir, 'site_prior', 'Fitted site prior',
        [(None, table), ('Every candidate', candidates),
         ('How it was fitted', how)],
        dict(
            rows=rows,
            candidates={
                name: fit.table
                for name, fit in fits.items()
            },
            info=setup.info,
            out=args.out))
    # the prior last: a fit that fails before leaves --out as it was
    main_fit.to_prior(setup.classes, args.out).save(args.out, decimals=6)
    print(table)
    verdict = (f'E_t + {main_fit.alpha:g} (E_site - E_t)' if main_fit.alpha
               else 'E_t (no candidate gained on these images' +
               (' beyond resampling noise' if args.accept == 'interval' else
                '') + ')')
    print(f'wrote {args.out}: {verdict} '
          f'({time.perf_counter() - start:.1f} s)')
    print('wrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    run_tool(main)
