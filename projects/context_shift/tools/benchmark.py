# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark end to end: generate the data, train the
plain tiny DINO and the tiny CaliDINO (calibrated on the DINO's cached
decoder outputs, or fine-tuned from it), and evaluate them (injection
table, per-site table, subset table, self-calibration per site, post-hoc
baselines on the plain DINO). Run from the repository root with it on
``PYTHONPATH``, as mmdet's projects are::

    export PYTHONPATH=$PWD:$PYTHONPATH
    python projects/context_shift/tools/benchmark.py            # full
    python projects/context_shift/tools/benchmark.py --quick    # short
    python projects/context_shift/tools/benchmark.py --quick \
        --dino-iters 600 --posthoc reweight --out-dir outputs/demo  # demo

Full: 3000 DINO iterations, then the CaliDINO's CaliFormer learns from the
final DINO's cached decoder outputs for 10,000 updates (the trunk stays
the DINO's; ``configs/*_cached_support.py`` on 10 classes,
``configs/*_many-class_cached.py`` on 40). ``--quick``: 900 DINO
iterations and 3,000 updates, no subset table. ``--calidet-init
finetune`` fine-tunes the whole CaliDINO from the final DINO instead (the
paper's recipe, ``--finetune-iters``), ``same-budget|scratch`` start it
otherwise.
``--variant many-class`` runs the 40-class data. Steps already done are
reused: the data folder when its ``meta.json`` holds the asked-for seed
and variant (else the default folder is generated again and another
``--data`` folder refused), and a work folder holding the last checkpoint
of a training with the same model, optimizer, schedule and init on the
same data (data seed, variant, validation sites and split files;
``--retrain`` trains again). Each training's output goes to
``<work folder>/train.log``. Writes ``results.md``, ``results.json`` and
the plots to ``--out-dir`` (default ``<work-dir>/results``).
"""
import argparse
import cProfile
import io
import os
import os.path as osp
import pstats
import sys
import time
from typing import Dict

try:
    from projects.context_shift.context_shift import (DETECTORS, VARIANTS,
                                                      detector_configs,
                                                      ensure_data,
                                                      evaluate_all,
                                                      ran_schedule, schedule,
                                                      train_both,
                                                      write_results)
except ImportError as exc:  # not run from the root with it on PYTHONPATH
    sys.exit(f'benchmark.py: error: {exc}; run it from the repository root '
             'with export PYTHONPATH=$PWD:$PYTHONPATH')
from mmcalidet.calibration import ACCEPT, DEFAULT_ACCEPT, DEFAULT_TRUST_RADIUS
from mmcalidet.evaluation.baselines import CORRECTION_NAMES, CORRECTIONS
from mmcalidet.utils.cli import (finite_float, non_negative_int, positive_int,
                                 run_tool, seed_int, trust_radius, unit_float)
from mmcalidet.utils.log_level import log_to_file


def _add_data_options(group: argparse._ArgumentGroup) -> None:
    """The data: its variant, folder and seed.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--variant',
        choices=tuple(VARIANTS),
        default='digits',
        help='the data: 10 digit classes, or 40 digit x colour classes '
        'with COCO-like sparsity (2-4 classes per image)')
    group.add_argument(
        '--data',
        help='benchmark data folder (generated when missing; default '
        'data/context_shift or data/context_shift_many-class)')
    group.add_argument(
        '--seed',
        type=seed_int,
        default=0,
        help='data seed, in [0, 2**32 - 1]; a --data folder of another '
        'seed or variant is refused (the default folder is generated '
        'again)')
    group.add_argument(
        '--validation-sites',
        action='store_true',
        help='the data is a recipe-selection folder: its val split the '
        'simulated sites of the training mixture (make_data.py '
        '--validation-sites), not the deployment sites; generated so when '
        'missing')


def _add_training_options(group: argparse._ArgumentGroup) -> None:
    """The DINO's training: its schedule, overrides and folder.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--dino-iters',
        type=positive_int,
        help='plain DINO iterations (the plain baseline\'s: the RTMDet\'s '
        'or the Faster R-CNN\'s with --detector)')
    group.add_argument(
        '--finetune-iters',
        type=positive_int,
        help='CaliDINO fine-tune iterations (see --calidet-init)')
    group.add_argument(
        '--decay-at',
        type=finite_float(0, 1, low_open=True),
        default=5 / 6,
        help='lr x0.1 at this fraction of the DINO schedule (the paper: '
        '5 of 6 epochs)')
    group.add_argument(
        '--train-seed',
        type=seed_int,
        default=0,
        help='the seed of both trainings (randomness.seed), in [0, '
        '2**32 - 1]: the same command trains the same models; another seed '
        'measures the run-to-run spread on the same data')
    group.add_argument(
        '--retrain', action='store_true', help='train even if done')
    group.add_argument(
        '--train-only', action='store_true', help='stop after training')
    group.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='more config overrides for both trainings')
    group.add_argument(
        '--dino-work-dir',
        help='the plain DINO training to use (trained there if missing; '
        'default <work-dir>/dino, or <work-dir>/<detector> with '
        '--detector): ablations of the CaliDINO share one')


def _add_calibrator_options(group: argparse._ArgumentGroup) -> None:
    """The CaliDINO: its start and its calibrator recipe.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--calibrator-updates',
        type=positive_int,
        help='CaliFormer updates on cached decoder outputs (--calidet-init '
        'cached; default 10,000, 3,000 with --quick; the CaliRTMDet\'s '
        '10,000 with either)')
    group.add_argument(
        '--calidet-init',
        choices=('cached', 'finetune', 'same-budget', 'scratch'),
        default='cached',
        help='cached: the CaliFormer of the CaliDINO learns from the final '
        'DINO\'s cached decoder outputs for --calibrator-updates steps (the '
        'trunk stays the DINO\'s); finetune (the paper\'s recipe): CaliDINO '
        'fine-tunes the final DINO for --finetune-iters more; same-budget: '
        'it starts from '
        'the DINO at dino-iters - finetune-iters and runs the rest of its '
        'schedule; scratch: it trains the DINO schedule from scratch, both '
        'trainings side by side')
    group.add_argument(
        '--calibrator-config',
        help='the calibrator config of --calidet-init cached (default: on '
        '10 classes the support-aware prior, projects/context_shift/'
        'configs/calidet_dino_tiny_context-shift_cached_support.py; on 40 '
        'calidet_dino_tiny_context-shift_many-class_cached.py), e.g. the '
        'presence-trained recipe, calidet_dino_tiny_context-shift_cached.py'
        ', or the paper\'s, calidet_dino_tiny_context-shift_cached_paper.py')
    group.add_argument(
        '--calibrator-seeds',
        type=seed_int,
        nargs='+',
        metavar='SEED',
        help='--calidet-init cached: train the calibrator once per seed on '
        'the same cached DINO (folders <calidet>_seed<S>; results in '
        '<out-dir>/seed_<S>) and write seeds.md / seeds.json: each site, '
        'mean-over-sites and sweep row\'s gain, its mean and range over the '
        'seeds (e.g. 0 1 2; the data seed, --seed, is another matter: keep '
        'data seed 1 held out)')
    group.add_argument(
        '--calidet-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='config overrides for the CaliDINO only (ablations, e.g. '
        'model.bbox_head.loss_loma.loss_weight=20)')


def _add_row_options(group: argparse._ArgumentGroup) -> None:
    """The evaluation and deployment rows: post-hoc corrections and priors
    fitted on labelled site images.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--fit-labelled',
        type=positive_int,
        nargs='+',
        default=[32],
        metavar='N',
        help='deployment rows: labelled images of a site the raw and the '
        'fitted site prior are estimated from (32; several: a row each, '
        'e.g. 8 32 128)')
    group.add_argument(
        '--fit-repeats',
        type=non_negative_int,
        default=10,
        help='deployment rows: random draws of those images per site (10; '
        '0: no deployment rows)')
    group.add_argument(
        '--fit-accept',
        choices=ACCEPT,
        default=DEFAULT_ACCEPT,
        help='deployment rows: when the fitted prior leaves E_t ("interval", '
        'the default: the low end of its cross-validated gain\'s bootstrap '
        'interval is above 0; "gain": the gain is)')
    group.add_argument(
        '--bootstrap-resamples',
        type=positive_int,
        default=1000,
        help='paired bootstrap resamples of each site gain\'s 90 %% interval '
        '(1000; the sweep\'s: a fifth)')
    group.add_argument(
        '--posthoc',
        nargs='*',
        choices=CORRECTIONS,
        default=list(CORRECTIONS),
        help='post-hoc prior corrections of the plain DINO to compare with '
        '(default: ' + ' and '.join(CORRECTION_NAMES[c] for c in CORRECTIONS) +
        '; no value: the plain DINO alone). Each costs about a third of '
        'the evaluation')


def _add_self_calibration_options(group: argparse._ArgumentGroup) -> None:
    """Self-calibration, batch and online.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--self-cal-iters',
        type=non_negative_int,
        default=10,
        help='self-calibration iterations per site')
    group.add_argument(
        '--self-cal-radius',
        type=trust_radius,
        nargs='+',
        default=[DEFAULT_TRUST_RADIUS],
        metavar='R',
        help='self-calibration trust region: keep E_c within this mean '
        f'absolute distance of E_t (default {DEFAULT_TRUST_RADIUS}); "none": '
        'no limit, the paper\'s; several: a row each')
    group.add_argument(
        '--online-radius',
        type=trust_radius,
        nargs='+',
        default=[DEFAULT_TRUST_RADIUS],
        metavar='R',
        help='online self-calibration rows: the calibrator\'s trust radius '
        f'(default {DEFAULT_TRUST_RADIUS}); "none": no limit; several: a row '
        'each')
    group.add_argument(
        '--score-thr',
        type=unit_float,
        default=0.3,
        help='self-calibration score threshold, in [0, 1]')


def _add_output_options(group: argparse._ArgumentGroup) -> None:
    """Where the results go, progress bars and the profile.

    Args:
        group: the parser's argument group to add the options to.
    """
    group.add_argument(
        '--work-dir',
        help='training folder (default work_dirs/context_shift, '
        'work_dirs/context_shift_quick with --quick)')
    group.add_argument(
        '--out-dir', help='results folder (default <work-dir>/results)')
    group.add_argument(
        '--no-progress', action='store_true', help='no progress bars')
    group.add_argument(
        '--profile',
        action='store_true',
        help='also write profile.md to the output folder: the time of each '
        'stage and table, and the costliest functions of the evaluation '
        '(cProfile); benchmarks/bench_train_step.py --profile gives those '
        'of a training iteration')


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's options, grouped by what they set.

    Args:
        argv (list[str], optional): the arguments (default: sys.argv).

    Returns:
        argparse.Namespace: the parsed options.
    """
    parser = argparse.ArgumentParser(
        description='Context-shift benchmark: generate, train, evaluate')
    parser.add_argument(
        '--detector',
        choices=DETECTORS,
        default='dino',
        help='the detector: the tiny DINO and its CaliDINO (default), the '
        'tiny one-stage RTMDet and its CaliRTMDet, or the tiny two-stage '
        'Faster R-CNN and its CaliFasterRCNN; the last two\'s CaliFormer '
        'learns from the plain detector\'s cached features (dense '
        'locations, sampled RoIs; 10 classes, --calidet-init cached only; '
        '--dino-iters sets the plain detector\'s iterations, '
        '--dino-work-dir its folder, default <work-dir>/<detector>)')
    parser.add_argument(
        '--quick',
        action='store_true',
        help='the short version (the DINO 900 iterations, then 3,000 '
        'calibrator updates or a 300-iteration fine-tune; no subset table)')
    _add_data_options(parser.add_argument_group('data'))
    _add_training_options(parser.add_argument_group('training'))
    _add_calibrator_options(
        parser.add_argument_group(
            'calibrator', 'the CaliDINO: its start and its calibrator recipe'))
    _add_row_options(
        parser.add_argument_group(
            'evaluation and deployment rows',
            'post-hoc corrections and priors fitted on labelled site images'))
    _add_self_calibration_options(
        parser.add_argument_group('self-calibration'))
    _add_output_options(parser.add_argument_group('output'))
    return parser.parse_args(argv)


def write_profile(out_dir: str,
                  stages: Dict[str, float],
                  results: Dict,
                  profiler: cProfile.Profile,
                  top: int = 25) -> str:
    """Write ``profile.md``: the seconds of each stage and of each table,
    and the evaluation's costliest functions.

    Args:
        out_dir (str): the output folder.
        stages (dict): stage name -> seconds (data, trainings, evaluation).
        results (dict): :func:`evaluate_all`'s result (its ``timings``).
        profiler (cProfile.Profile): the evaluation's profile.
        top (int): how many functions to list.

    Returns:
        str: the path written.
    """
    lines = [
        '# Where the benchmark\'s time went', '', '| stage | seconds |',
        '|---|---|'
    ]
    lines += [f'| {name} | {secs:.1f} |' for name, secs in stages.items()]
    lines += [
        f'| evaluation: {name} | {secs:.1f} |'
        for name, secs in (results.get('timings') or {}).items()
    ]
    text = io.StringIO()
    pstats.Stats(
        profiler, stream=text).sort_stats('cumulative').print_stats(top)
    lines += [
        '', f'The evaluation\'s {top} costliest functions '
        '(cumulative, cProfile):', '', '```',
        text.getvalue().strip(), '```', ''
    ]
    path = osp.join(out_dir, 'profile.md')
    with open(path, 'w') as f:
        f.write('\n'.join(lines))
    return path


def _evaluate(args, trained: Dict, out_dir: str, meta: Dict, log: str) -> Dict:
    """:func:`evaluate_all` with the benchmark's options."""
    return evaluate_all(
        trained,
        out_dir,
        meta,
        data=args.data,
        posthoc=args.posthoc,
        quick=args.quick,
        fit_labelled=args.fit_labelled,
        fit_repeats=args.fit_repeats,
        fit_accept=args.fit_accept,
        self_cal_iters=args.self_cal_iters,
        score_thr=args.score_thr,
        self_cal_radius=args.self_cal_radius,
        online_radius=args.online_radius,
        progress=not args.no_progress,
        log_file=log,
        resamples=args.bootstrap_resamples)


def calibrator_seeds(args, argv, sched: Dict, work_dir: str, out_dir: str,
                     meta: Dict, log: str, start: float) -> int:
    """``--calibrator-seeds``: per seed, the calibrator trained on the
    same cached DINO and every table in ``<out-dir>/seed_<S>``; then
    ``seeds.md`` / ``seeds.json`` in ``<out-dir>``: each row's gain, mean
    and range over the seeds."""
    from mmcalidet.evaluation import write_report
    from projects.context_shift.context_shift.seeds import (seed_markdown,
                                                            seed_rows)
    per_seed = {}
    for seed in args.calibrator_seeds:
        args.calibrator_seed = seed
        print(f'[seeds] calibrator seed {seed}', flush=True)
        trained = train_both(args, sched, work_dir)
        if args.train_only:
            continue
        folder = osp.join(out_dir, f'seed_{seed}')
        os.makedirs(folder, exist_ok=True)
        results = _evaluate(args, trained, folder, meta, log)
        write_results(folder, results, trained, ran_schedule(sched, trained),
                      argv,
                      time.perf_counter() - start)
        per_seed[seed] = results
    if args.train_only:
        return 0
    rows = seed_rows(per_seed)
    table = seed_markdown(rows, list(per_seed))
    cmd = ('python projects/context_shift/tools/benchmark.py ' +
           ' '.join(argv)).strip()
    paths = write_report(
        out_dir, 'seeds', 'Calibrator seeds: mean and range of each gain',
        [(None, f'Command: `{cmd}`; {time.strftime("%Y-%m-%d")}, '
          f'{os.cpu_count()} CPU cores'), (None, table),
         (None, 'AP gains (points) of each row under each calibrator seed, '
          'the same cached DINO and data; per seed, every table in '
          'seed_<S>/results.md.')],
        dict(rows=rows, seeds=list(per_seed), command=cmd))
    print('\n' + table)
    print(f'\nwrote {paths[0]}')
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    start = time.perf_counter()
    sched = schedule(args)
    detector_configs(args)  # a detector without the asked-for recipe
    if args.calibrator_seeds and args.calidet_init != 'cached':
        raise ValueError('--calibrator-seeds: only with --calidet-init cached '
                         '(the calibrators share the cached DINO)')
    if args.calibrator_config:
        problem = None
        if args.calidet_init != 'cached':
            problem = 'only with --calidet-init cached'
        elif not osp.isfile(args.calibrator_config):
            problem = 'not a file'
        if problem:
            raise ValueError(
                f'--calibrator-config {args.calibrator_config}: {problem}')
    args.data = args.data or VARIANTS[args.variant]['data']
    work_dir = args.work_dir or osp.join(
        'work_dirs', 'context_shift' +
        ('' if args.variant == 'digits' else '_' + args.variant) +
        ('_quick' if args.quick else ''))
    out_dir = args.out_dir or osp.join(work_dir, 'results')
    # mmengine's reports (config and checkpoint reads) and library
    # warnings: to the work folder's log; the console keeps the stages
    os.makedirs(work_dir, exist_ok=True)
    log = log_to_file(osp.join(work_dir, 'benchmark.log'))
    meta = ensure_data(args)
    if args.calibrator_seeds:
        return calibrator_seeds(args, argv, sched, work_dir, out_dir, meta,
                                log, start)
    started_training = time.perf_counter()
    trained = train_both(args, sched, work_dir)
    if args.train_only:
        return 0
    sched = ran_schedule(sched, trained)
    os.makedirs(out_dir, exist_ok=True)
    cached = 'decoder outputs' if args.detector == 'dino' else 'features'
    print(f'[eval] caching {cached} and evaluating (log: {log})', flush=True)
    evaluation = time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    results = _evaluate(args, trained, out_dir, meta, log)
    if profiler:
        profiler.disable()
        stages = dict(
            data=started_training - start,
            **{
                f'train {k}': v
                for k, v in trained['seconds'].items()
            },
            evaluation=time.perf_counter() - evaluation)
        print(
            f'[profile] {write_profile(out_dir, stages, results, profiler)}',
            flush=True)
    path = write_results(out_dir, results, trained, sched, argv,
                         time.perf_counter() - start)
    print('\n' + results['injection_md'] + '\n')
    print(results['sites_md'] + '\n')
    print(results['site_summary_md'] + '\n')
    if results['deployment_md']:
        print(results['deployment_md'] + '\n')
    print(results['self_calibration_md'] + '\n')
    print(results['online_md'] + '\n')
    print('\n'.join(f'- {c}' for c in results['claims']))
    print(f'\nwrote {path} and {len(results["plots"])} plots '
          f'({(time.perf_counter() - start) / 60:.1f} min)')
    return 0


if __name__ == '__main__':
    run_tool(main)
