# Copyright (c) mmcalidet contributors. All rights reserved.
"""Self-calibration (the paper's Algo. 1 and Sec. 4.4): a frozen CaliDet
calibrates its prior from its own predictions on random subsets of the
evaluation set; records AP, step MAE and step MAX per iteration.

    python tools/analysis_tools/self_calibrate.py CONFIG CHECKPOINT \
        --sizes 8 64 256 --num-images 1024 --iters 20 --eta 4 \
        --out-dir work_dirs/self_calibration

``--sizes 0`` calibrates on the whole evaluation set (``--save-prior``
then writes the final E_c as a prior file). ``--score-thrs 0.2 0.3 0.5``
compares thresholds. Writes ``self_calibration.md``, ``.json``
and ``.png`` (one curve per size, threshold and method).
"""
import argparse
import os.path as osp
import sys
import time
from typing import Dict, List, Tuple

from mmcalidet.calibration import (DEFAULT_ETA, DEFAULT_SCORE_THR,
                                   DEFAULT_TRUST_RADIUS,
                                   self_calibrate_partitions)
from mmcalidet.evaluation import (cache_evaluator, calibration_subsets,
                                  check_subset_sizes, markdown_table,
                                  write_report)
from mmcalidet.utils.cli import (finite_float, non_negative_int, positive_int,
                                 run_tool, seed_int, trust_radius, unit_float)
from mmcalidet.utils.file_io import check_writable_file
from mmcalidet.visualization import plot_self_calibration

# the tools' shared options, beside this file
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from eval_options import (add_model_args, check_out_dir, ensure_out_dir,
                          eval_setup, nothing_left_on_failure)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Self-calibrate a frozen CaliDet on its predictions')
    parser.add_argument('config', help='CaliDet config')
    parser.add_argument('checkpoint', help='its checkpoint')
    parser.add_argument(
        '--sizes',
        type=non_negative_int,
        nargs='+',
        default=[0],
        help='subset sizes (0: the whole evaluation set as one set)')
    parser.add_argument(
        '--num-images',
        type=positive_int,
        default=1024,
        help='images per size, over all its subsets (the paper: 1024)')
    parser.add_argument('--seed', type=seed_int, default=0, help='split seed')
    parser.add_argument(
        '--iters',
        type=non_negative_int,
        default=20,
        help='maximum iterations')
    parser.add_argument(
        '--eta',
        type=finite_float(0, low_open=True),
        default=DEFAULT_ETA,
        help='step size (> 0)')
    parser.add_argument(
        '--score-thrs',
        type=unit_float,
        nargs='+',
        default=[DEFAULT_SCORE_THR],
        help='score thresholds in [0, 1] for "class predicted" (several: '
        'compare)')
    parser.add_argument(
        '--tol',
        type=finite_float(0),
        default=1e-3,
        help='stop when the step MAX is below it (0: never)')
    parser.add_argument(
        '--trust-radius',
        type=trust_radius,
        default=DEFAULT_TRUST_RADIUS,
        help='keep E_c within this mean absolute distance of E_t '
        f'(default {DEFAULT_TRUST_RADIUS}; "none": no limit, the paper\'s '
        'Algo. 1)')
    parser.add_argument(
        '--eval-interval',
        type=positive_int,
        default=1,
        help='COCO AP every N iterations (and at the first and last)')
    parser.add_argument(
        '--save-prior',
        help='write the final E_c (one size 0 run) to this prior file')
    add_model_args(parser)
    args = parser.parse_args(argv)
    if args.save_prior and (args.sizes != [0] or len(args.score_thrs) > 1):
        parser.error('--save-prior needs --sizes 0 and one --score-thrs')
    return args


def summary_row(method: str, size: int, thr: float, out: Dict) -> Dict:
    """The summary table's row of one method, subset size and threshold.

    Args:
        method (str): the method's name.
        size (int): images per subset.
        thr (float): the score threshold.
        out (dict): what ``self_calibrate_partitions`` returned.

    Returns:
        dict: the row (AP at the start and the end, the gain, convergence).
    """
    mean = out['mean']
    return dict(
        method=method,
        size=size,
        score_thr=thr,
        subsets=len(out['subsets']),
        iters=len(mean) - 1,
        converged=sum(r.converged for r in out['results']),
        AP_start=mean[0].get('AP'),
        AP_end=mean[-1].get('AP'),
        gain=mean[-1].get('AP', float('nan')) -
        mean[0].get('AP', float('nan')),
        step_max_end=mean[-1]['step_max'])


def calibrate_all(setup, methods: List, args: argparse.Namespace) -> Tuple:
    """Self-calibrate every method on every subset size and threshold.

    Args:
        setup (EvalSetup): the cached evaluation set-up.
        methods (list): the methods that take a prior.
        args (argparse.Namespace): the tool's options.

    Returns:
        tuple: the curves by label, the per-iteration rows, the summary rows
        and the first method's first calibrated prior (with the support it
        was scored with, or ``None``).
    """
    evaluate = cache_evaluator(setup.evaluator)
    curves, rows, summary, final = {}, [], [], None
    # every method shares the main model's images (EvalSetup checks it)
    splits = {
        size:
        calibration_subsets(
            len(setup.cache), size, args.num_images, args.seed)
        for size in args.sizes
    }
    for method in methods:
        for size in args.sizes:
            for thr in args.score_thrs:
                out = self_calibrate_partitions(
                    method.rescorer.model,
                    method.cache,
                    splits[size],
                    evaluate=evaluate,
                    progress=not args.no_progress,
                    eta=args.eta,
                    iters=args.iters,
                    score_thr=thr,
                    tol=args.tol,
                    init_prior=setup.train_prior,
                    init_support=method.rescorer.support_of(
                        setup.train_prior),
                    correction=method.rescorer.correction,
                    batch_size=args.rescore_batch_size,
                    eval_interval=args.eval_interval,
                    trust_radius=args.trust_radius)
                n = len(out['subsets'][0])
                label = f'{method.name}, size {n}' + (
                    f', thr {thr:g}' if len(args.score_thrs) > 1 else '')
                curves[label] = out['mean']
                for rec in out['mean']:
                    rows.append(
                        dict(method=method.name, size=n, score_thr=thr, **rec))
                summary.append(summary_row(method.name, n, thr, out))
                if method is methods[0] and final is None:
                    # E_c with the support it was scored with (E_t's, for
                    # a support-aware CaliFormer)
                    final = (out['results'][0].prior,
                             method.rescorer.support_of(setup.train_prior))
    return curves, rows, summary, final


def tables(summary: List[Dict], rows: List[Dict]) -> Tuple[str, str]:
    """The summary and the per-iteration Markdown tables.

    Args:
        summary (list[dict]): :func:`summary_row`'s rows.
        rows (list[dict]): one row per method, size, threshold, iteration.

    Returns:
        tuple[str, str]: the two tables.
    """
    summary_table = markdown_table(
        summary, [('method', 'method', ''), ('size', 'subset size', ''),
                  ('score_thr', 'score thr', 'g'), ('subsets', 'subsets', ''),
                  ('iters', 'iterations', ''), ('converged', 'converged', ''),
                  ('AP_start', 'AP(E_t)', 'pct'), ('AP_end', 'AP(E_c)', 'pct'),
                  ('gain', 'gain', 'gain'),
                  ('step_max_end', 'last step MAX', '.4f')])
    curve_table = markdown_table(rows, [('method', 'method', ''),
                                        ('size', 'size', ''),
                                        ('score_thr', 'thr', 'g'),
                                        ('iter', 'iter', ''),
                                        ('AP', 'AP', 'pct'),
                                        ('step_mae', 'step MAE', '.5f'),
                                        ('step_max', 'step MAX', '.5f'),
                                        ('num_present', 'classes/img', '.2f')])
    return summary_table, curve_table


def check_options(args: argparse.Namespace) -> None:
    """What can be refused before the detector pass: subset sizes above
    the images there will be at most, and outputs that cannot be written.

    Args:
        args (argparse.Namespace): the parsed options.

    Raises:
        ValueError: one line naming the option.
    """
    bound, what = args.num_images, f' (--num-images {args.num_images})'
    if args.max_images is not None and args.max_images < bound:
        bound, what = args.max_images, f' (--max-images {args.max_images})'
    check_subset_sizes(args.sizes, bound, what)
    check_out_dir(args.out_dir)
    if args.save_prior:
        check_writable_file(args.save_prior, '--save-prior')


def main(argv=None) -> int:
    args = parse_args(argv)
    check_options(args)
    with nothing_left_on_failure(args.out_dir):
        return run(args)


def run(args: argparse.Namespace) -> int:
    """Cache, self-calibrate and write the report (``main`` once the
    options are checked).

    Args:
        args (argparse.Namespace): the parsed options.

    Returns:
        int: 0.
    """
    out_dir = ensure_out_dir(args.out_dir)
    start = time.perf_counter()
    setup = eval_setup(args)
    methods = [m for m in setup.methods if m.takes_prior]
    if not methods:
        raise ValueError('no detector takes a prior: pass a CaliDet '
                         'checkpoint or post-hoc corrections')
    cached = time.perf_counter()
    curves, rows, summary, final = calibrate_all(setup, methods, args)
    done = time.perf_counter()
    summary_table, curve_table = tables(summary, rows)
    options = dict(
        eta=args.eta,
        iters=args.iters,
        tol=args.tol,
        score_thrs=args.score_thrs,
        num_images=args.num_images,
        seed=args.seed,
        eval_interval=args.eval_interval)
    how = (f'E_c starts at E_t; per iteration the subset is re-scored under '
           f'E_c (cached decoder outputs), classes with a detection scoring '
           f'>= the threshold give E_i, Z = mean max score per class, E_c <- '
           f'clip(E_c + eta Z (E_i - E_c), 0, 1), diagonal 1. Curves are '
           f'means over subsets (a subset that converged keeps its last '
           f'values). Options: {options}.')
    timing = (f'{setup.info["num_images"]} images cached in '
              f'{cached - start:.1f} s; self-calibration {done - cached:.1f} '
              's.')
    paths = write_report(
        out_dir, 'self_calibration', 'Self-calibration',
        [(None, summary_table), ('Per iteration', curve_table), ('How', how),
         ('Run', timing)],
        dict(
            summary=summary,
            curves=rows,
            options=options,
            info=setup.info))
    paths.append(
        plot_self_calibration(curves, osp.join(out_dir,
                                               'self_calibration.png')))
    if args.save_prior:
        from mmcalidet.priors import Prior
        matrix, support = final
        paths.append(
            Prior(
                matrix,
                setup.classes,
                *(support or (None, None)),
                meta=dict(
                    source=f'self-calibration of {args.checkpoint}',
                    images_used=min(args.num_images,
                                    setup.info['num_images']),
                    self_calibration=options),
                name=args.save_prior).save(args.save_prior))
    print(summary_table)
    print(timing)
    print('wrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    run_tool(main)
