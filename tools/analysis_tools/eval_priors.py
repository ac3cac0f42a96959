# Copyright (c) mmcalidet contributors. All rights reserved.
"""The standard injection table (the paper's Tab. 2): COCO metrics of a
CaliDet checkpoint under flip(E_x), E0, E_t, E_v, E_b, E_x, and of a
plain detector (with post-hoc corrections at the same priors) when given.

    python tools/analysis_tools/eval_priors.py CONFIG CHECKPOINT \
        [--baseline-config DINO_CONFIG --baseline-checkpoint DINO_CKPT] \
        [--priors flip_E_x E0 E_t E_v E_b E_x site=my_prior.json] \
        --out-dir work_dirs/eval_priors

Backbone and transformer run once per image (cached decoder outputs);
each prior re-scores the cache. Writes ``priors.md``, ``priors.json`` and
``priors.png`` to ``--out-dir`` and says whether the expected order
(AP non-decreasing from flip(E_x) to E_x, the last above the first) holds,
does not hold, or is undecidable (all APs within ``--order-tol`` AP points
of each other, e.g. an untrained model's all-zero APs).
"""
import argparse
import os.path as osp
import sys
import time

from mmcalidet.evaluation import (CONTENT_PRIORS, STANDARD_PRIORS,
                                  FeatureCache, cache_evaluator, protocol,
                                  report, write_report)
from mmcalidet.evaluation.baselines import describe_corrections
from mmcalidet.evaluation.sweep import parse_prior_names
from mmcalidet.utils.cli import finite_float, run_tool
from mmcalidet.visualization import plot_prior_sweep

# the tools' shared options, beside this file
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from eval_options import (add_model_args, check_out_dir, ensure_out_dir,
                          eval_setup, nothing_left_on_failure)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Evaluate a CaliDet checkpoint under standard priors')
    parser.add_argument('config', help='CaliDet (or plain detector) config')
    parser.add_argument(
        'checkpoint', help='its checkpoint (`none`: random weights)')
    parser.add_argument(
        '--priors',
        nargs='+',
        default=list(STANDARD_PRIORS),
        metavar='PRIOR',
        help='priors in table order: ' + ', '.join(STANDARD_PRIORS) +
        ' (and ' + ', '.join(p for p in CONTENT_PRIORS if p != 'E_t') +
        ': E_x and flip(E_x) with the absent classes\' columns from E_t), '
        'or LABEL=FILE for a prior file / shipped name')
    parser.add_argument(
        '--order-tol',
        type=finite_float(0),
        default=0.0,
        metavar='POINTS',
        help='AP differences up to this many AP points (0.1 = 0.1 AP) count '
        'as ties in the expected-order verdict; the order is undecidable '
        'when all APs lie within it (default 0: any strict difference)')
    add_model_args(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # the prior names and files and the output folder, checked before the
    # detector pass; a failure leaves no out-dir or eval.log behind
    names, extra = parse_prior_names(args.priors)
    check_out_dir(args.out_dir)
    with nothing_left_on_failure(args.out_dir):
        return run(args, names, extra)


def run(args: argparse.Namespace, names: list, extra: dict) -> int:
    """The cache pass, the table and the report (``main`` once the
    options are checked).

    Args:
        args (argparse.Namespace): the parsed options.
        names (list[str]): the prior keys in table order.
        extra (dict): label -> prior file / shipped name.

    Returns:
        int: 0.
    """
    out_dir = ensure_out_dir(args.out_dir)
    start = time.perf_counter()
    setup = eval_setup(args)
    cached = time.perf_counter()
    injection = protocol.injection(
        setup.methods,
        cache_evaluator(setup.evaluator),
        setup.train_prior,
        names,
        extra,
        setup.classes,
        tol=args.order_tol / 100,
        progress=not args.no_progress,
        workers=args.eval_workers)
    done = time.perf_counter()
    rows, table = injection.rows, injection.markdown
    specs, orders = injection.extras['specs'], injection.extras['orders']
    order_text = (f'Expected order (AP non-decreasing, the last above the '
                  f'first; ties within {args.order_tol:.2f} AP):\n' +
                  '\n'.join(report.order_lines(orders)))
    notes = '\n'.join(f'- {s.label}: {s.note}' +
                      (' (oracle: uses the ground truth)' if s.oracle else '')
                      for s in specs)
    posthoc = [m.name for m in setup.methods if ' + ' in m.name]
    if posthoc:
        notes += '\n' + '\n'.join(f'- {k}: {v}'
                                  for k, v in describe_corrections().items())
    kind = 'feature' if isinstance(setup.cache, FeatureCache) else 'decoder'
    timing = (f'{setup.info["num_images"]} images; {kind} cache '
              f'{setup.cache.bytes_per_image / 2**20:.3f} MiB/image; cache '
              f'pass {cached - start:.1f} s, {len(rows)} re-scored '
              f'evaluations {done - cached:.1f} s.')
    sections = [(None, table), (None, order_text), ('Priors', notes),
                ('Run', timing)]
    paths = write_report(
        out_dir, 'priors', 'Evaluation under injected priors', sections,
        dict(
            rows=rows,
            expected_order=orders,
            info=setup.info,
            priors={s.key: s.note
                    for s in specs}))
    paths.append(plot_prior_sweep(rows, osp.join(out_dir, 'priors.png')))
    print(table)
    print(order_text)
    print(timing)
    print('wrote ' + ', '.join(paths))
    return 0


if __name__ == '__main__':
    run_tool(main)
