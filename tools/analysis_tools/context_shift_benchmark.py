# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark end to end: generate the data, train the
plain tiny DINO and the tiny CaliDINO (calibrated on the DINO's cached
decoder outputs, or fine-tuned from it), and evaluate them
(injection table, per-site table, subset table, self-calibration per site,
post-hoc baselines on the plain DINO).

    python tools/analysis_tools/context_shift_benchmark.py            # full
    python tools/analysis_tools/context_shift_benchmark.py --quick    # demo

Full: 3000 DINO iterations, then the CaliDINO's CaliFormer learns from
the final DINO's cached decoder outputs for 10,000 updates (the trunk stays
the DINO's; ``configs/context_shift/*_cached.py``). ``--quick``: 900 DINO
iterations and 3,000 updates, no subset table (``make demo``).
``--calidet-init finetune`` fine-tunes the whole CaliDINO from the final
DINO instead (the paper's recipe, ``--finetune-iters``),
``same-budget|scratch`` start it otherwise. ``--variant many-class`` runs
the 40-class data. Steps already done are reused: the data folder, and a
work folder holding the last checkpoint of a training with the same model,
optimizer, schedule and init (``--retrain`` trains again).
Evaluation builds each model from the config its training dumped. Writes ``results.md``, ``results.json`` and the plots to
``--out-dir`` (default ``<work-dir>/results``).
"""
import argparse
import json
import os
import os.path as osp
import platform
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmcalidet.utils.cli import run_tool  # noqa: E402

#: (plain DINO, CaliDINO fine-tune, CaliDINO calibrator) configs and the
#: default data folder of each data variant
VARIANTS = {
    'digits':
    dict(
        dino='configs/context_shift/dino_tiny_context-shift.py',
        calidet='configs/context_shift/calidet_dino_tiny_context-shift.py',
        cached='configs/context_shift/'
        'calidet_dino_tiny_context-shift_cached.py',
        data='data/context_shift'),
    'many-class':
    dict(
        dino='configs/context_shift/dino_tiny_context-shift_many-class.py',
        calidet='configs/context_shift/'
        'calidet_dino_tiny_context-shift_many-class.py',
        cached='configs/context_shift/'
        'calidet_dino_tiny_context-shift_many-class_cached.py',
        data='data/context_shift_many-class'),
}
SITES = ('like_train', 'left_only', 'crossed')
SUBSET_SIZES = (8, 16, 32, 64, 128, 256)
#: (dino iterations, fine-tune iterations, calibrator updates) per mode
SCHEDULES = dict(full=(3000, 1000, 10000), quick=(900, 300, 3000))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Context-shift benchmark: generate, train, evaluate')
    parser.add_argument(
        '--quick',
        action='store_true',
        help='the short version (900 + 300 iterations, no subset table)')
    parser.add_argument(
        '--variant',
        choices=tuple(VARIANTS),
        default='digits',
        help='the data: 10 digit classes, or 40 digit x colour classes '
        'with COCO-like sparsity (2-4 classes per image)')
    parser.add_argument(
        '--data',
        help='benchmark data folder (generated when missing; default '
        'data/context_shift or data/context_shift_many-class)')
    parser.add_argument('--seed', type=int, default=0, help='data seed')
    parser.add_argument(
        '--work-dir',
        help='training folder (default work_dirs/context_shift, '
        'work_dirs/context_shift_quick with --quick)')
    parser.add_argument(
        '--out-dir', help='results folder (default <work-dir>/results)')
    parser.add_argument(
        '--dino-iters', type=int, help='plain DINO iterations')
    parser.add_argument(
        '--finetune-iters',
        type=int,
        help='CaliDINO fine-tune iterations (see --calidet-init)')
    parser.add_argument(
        '--calibrator-updates',
        type=int,
        help='CaliFormer updates on cached decoder outputs (--calidet-init '
        'cached)')
    parser.add_argument(
        '--decay-at',
        type=float,
        default=5 / 6,
        help='lr x0.1 at this fraction of the DINO schedule (the paper: '
        '5 of 6 epochs)')
    parser.add_argument(
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
    parser.add_argument(
        '--retrain', action='store_true', help='train even if done')
    parser.add_argument(
        '--train-only', action='store_true', help='stop after training')
    parser.add_argument(
        '--self-cal-iters',
        type=int,
        default=10,
        help='self-calibration iterations per site')
    parser.add_argument(
        '--score-thr',
        type=float,
        default=0.3,
        help='self-calibration score threshold')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='more config overrides for both trainings')
    parser.add_argument(
        '--calidet-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='config overrides for the CaliDINO only (ablations, e.g. '
        'model.bbox_head.loss_loma.loss_weight=20)')
    parser.add_argument(
        '--dino-work-dir',
        help='the plain DINO training to use (trained there if missing; '
        'default <work-dir>/dino): ablations of the CaliDINO share one')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bars')
    return parser.parse_args(argv)


def schedule(args: argparse.Namespace) -> Dict:
    """The iterations of both trainings (checked).

    Returns:
        dict: ``dino`` (iterations), ``decay`` (its lr x0.1 iteration),
        ``init`` (``--calidet-init``), ``start`` (the DINO checkpoint the
        CaliDINO starts from; 0: none), ``calidet`` (CaliDINO iterations,
        or CaliFormer updates when ``cached``) and ``calidet_decay`` (its
        lr x0.1 iteration).
    """
    dino, ft, updates = SCHEDULES['quick' if args.quick else 'full']
    dino = args.dino_iters or dino
    ft = args.finetune_iters or ft
    updates = args.calibrator_updates or updates
    if dino < 1 or ft < 1 or updates < 1:
        raise ValueError('--dino-iters, --finetune-iters and '
                         '--calibrator-updates must be >= 1')
    decay = int(round(dino * args.decay_at))
    init = args.calidet_init
    if init == 'cached':  # the CaliFormer alone, on the final DINO
        return dict(dino=dino, decay=decay, init=init, start=dino,
                    calidet=updates,
                    calidet_decay=int(round(updates * args.decay_at)))
    if init == 'finetune':  # the paper's: from the final DINO
        return dict(dino=dino, decay=decay, init=init, start=dino,
                    calidet=ft, calidet_decay=int(round(ft * args.decay_at)))
    if init == 'scratch':
        return dict(dino=dino, decay=decay, init=init, start=0,
                    calidet=dino, calidet_decay=decay)
    if not ft < dino or dino % ft:
        raise ValueError(f'--finetune-iters ({ft}) must divide '
                         f'--dino-iters ({dino}) and be smaller')
    if not dino - ft < decay <= dino:
        raise ValueError(f'the lr decay (iteration {decay}) must fall in '
                         'the fine-tune window')
    return dict(dino=dino, decay=decay, init=init, start=dino - ft,
                calidet=ft, calidet_decay=decay - dino + ft)


def ensure_data(args: argparse.Namespace) -> Dict:
    """Generate the benchmark data unless the folder exists."""
    from mmcalidet.datasets.context_shift import make_context_shift
    meta_file = osp.join(args.data, 'meta.json')
    if osp.isfile(meta_file):
        print(f'[data] reusing {args.data}')
        with open(meta_file) as f:
            return json.load(f)
    print(f'[data] generating {args.data} (seed {args.seed}, '
          f'{args.variant})')
    return make_context_shift(
        args.data,
        seed=args.seed,
        progress=not args.no_progress,
        variant=args.variant)


#: the config parts that decide what a training produces
TRAINING_KEYS = ('model', 'optim_wrapper', 'param_scheduler', 'load_from')


def training_settings(config: str,
                      options: Sequence[str] = (),
                      data: Optional[str] = None) -> str:
    """The parts of a config (with ``--cfg-options`` applied) that decide
    what a training produces (:data:`TRAINING_KEYS`), as canonical JSON.

    Args:
        config (str): a config file (or the copy a training dumped).
        options (Sequence[str]): ``KEY=VALUE`` overrides.
        data (str, optional): the benchmark data folder
            (``MMCALIDET_CS_DATA``).

    Returns:
        str: JSON with sorted keys (tuples as lists).
    """
    from mmengine.config import Config, DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--o', nargs='*', action=DictAction, default={})
    overrides = parser.parse_args(['--o'] + list(options)).o
    old = os.environ.get('MMCALIDET_CS_DATA')
    if data is not None:
        os.environ['MMCALIDET_CS_DATA'] = osp.abspath(data)
    try:
        cfg = Config.fromfile(config)
    finally:
        if old is None:
            os.environ.pop('MMCALIDET_CS_DATA', None)
        else:
            os.environ['MMCALIDET_CS_DATA'] = old
    cfg.merge_from_dict(overrides)
    picked = {k: cfg.get(k) for k in TRAINING_KEYS}
    return json.dumps(
        json.loads(json.dumps(picked, default=str)), sort_keys=True)


class Training:
    """One tools/train.py run, skipped when ``iter_<max_iters>.pth``
    exists and the config that training dumped has the same
    :func:`training_settings` as this run (unless ``retrain``).

    Args:
        config (str): the config.
        work_dir (str): its work folder.
        max_iters (int): the last iteration (names the last checkpoint).
        options (list[str]): ``--cfg-options``.
        retrain (bool): train even if the last checkpoint exists.
        data (str): the benchmark data folder.
        threads (int, optional): torch threads (trainings side by side).
    """

    def __init__(self, config: str, work_dir: str, max_iters: int,
                 options: List[str], retrain: bool, data: str,
                 threads: Optional[int] = None) -> None:
        self.config, self.work_dir = config, work_dir
        self.last = osp.join(work_dir, f'iter_{max_iters}.pth')
        self.proc = None
        self.start = time.perf_counter()
        self.seconds = 0.0
        if osp.isfile(self.last) and not retrain:
            dumped = trained_config(work_dir, config)
            if dumped == config:
                print(f'[train] reusing {self.last} (no config dumped '
                      'beside it to compare)')
                return
            if training_settings(dumped) == training_settings(
                    config, options, data):
                print(f'[train] reusing {self.last}')
                return
            print(f'[train] {work_dir} was trained with other settings '
                  f'(model, optimizer, schedule or init; see {dumped}): '
                  'training again')
        cmd = [
            sys.executable,
            osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
            work_dir, '--cfg-options'
        ] + options
        print('[train] ' + ' '.join(cmd[1:]), flush=True)
        env = dict(os.environ, MMCALIDET_CS_DATA=osp.abspath(data))
        env.pop('MMCALIDET_LIGHT', None)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads),
                       MKL_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env)

    @property
    def reused(self) -> bool:
        return self.proc is None

    def wait(self) -> float:
        """Wait for the run; returns its wall-clock seconds (0: reused)."""
        if self.proc is None:
            return 0.0
        code = self.proc.wait()
        if code != 0:
            raise RuntimeError(f'training {self.config} failed (exit '
                               f'{code}); see {self.work_dir}')
        if not osp.isfile(self.last):
            raise RuntimeError(f'training {self.config} wrote no '
                               f'{self.last}')
        self.seconds = time.perf_counter() - self.start
        return self.seconds


def train_both(args, sched: Dict, work_dir: str) -> Dict:
    """Train the plain DINO and the CaliDINO (see :func:`schedule`)."""
    configs = VARIANTS[args.variant]
    dino_config, calidet_config, cached_config = (configs['dino'],
                                                  configs['calidet'],
                                                  configs['cached'])
    dino_dir = args.dino_work_dir or osp.join(work_dir, 'dino')
    cali_dir = osp.join(work_dir, 'calidet')
    common = ['default_hooks.logger.interval=50'] + list(args.cfg_options)

    def opts(iters, decay, interval):
        return [
            f'train_cfg.max_iters={iters}', f'train_cfg.val_begin={iters + 1}',
            f'param_scheduler.0.end={iters}',
            f'param_scheduler.0.milestones=[{decay}]',
            f'default_hooks.checkpoint.interval={interval}'
        ]

    interval = sched['dino'] - sched['start'] if sched['init'] == \
        'same-budget' else sched['dino']
    dino_opts = opts(sched['dino'], sched['decay'], interval) + [
        'default_hooks.checkpoint.max_keep_ckpts=-1'
    ] + common
    cali_opts = opts(sched['calidet'], sched['calidet_decay'],
                     sched['calidet'])
    if sched['init'] == 'scratch':
        # the DINO's lr for every part, side by side with the DINO
        cali_opts += [
            'load_from=None', 'optim_wrapper.optimizer.lr=2e-4',
            'optim_wrapper.paramwise_cfg.custom_keys.califormer.lr_mult=1.0'
        ]
        threads = max(1, (os.cpu_count() or 2) // 2)
        dino = Training(dino_config, dino_dir, sched['dino'], dino_opts,
                        args.retrain, args.data, threads)
        cali = Training(calidet_config, cali_dir, sched['calidet'],
                        cali_opts + common + list(args.calidet_options),
                        args.retrain, args.data, threads)
        secs = dict(dino=dino.wait(), calidet=cali.wait())
    elif sched['init'] == 'cached':
        secs = dict(
            dino=Training(dino_config, dino_dir, sched['dino'], dino_opts,
                          args.retrain, args.data).wait())
        start = osp.join(dino_dir, f'iter_{sched["dino"]}.pth')
        cali_opts += [
            f'load_from={start}',
            f'train_dataloader.dataset.source.checkpoint={start}',
            f'train_dataloader.dataset.source.config={dino_config}',
            'train_dataloader.dataset.cache_dir='
            f'{osp.join(dino_dir, "decoder_cache_train")}',
            f'default_hooks.logger.interval={max(1, sched["calidet"] // 10)}'
        ]
        secs['calidet'] = Training(
            cached_config, cali_dir, sched['calidet'],
            cali_opts + list(args.cfg_options) + list(args.calidet_options),
            args.retrain or secs['dino'] > 0, args.data).wait()
    else:
        start = osp.join(dino_dir, f'iter_{sched["start"]}.pth')
        cali_opts.append(f'load_from={start}')
        secs = dict(
            dino=Training(dino_config, dino_dir, sched['dino'], dino_opts,
                          args.retrain, args.data).wait())
        # a retrained DINO invalidates the CaliDINO fine-tuned from it
        secs['calidet'] = Training(
            calidet_config, cali_dir, sched['calidet'],
            cali_opts + common + list(args.calidet_options), args.retrain
            or secs['dino'] > 0, args.data).wait()
    return dict(
        dino_dir=dino_dir,
        calidet_dir=cali_dir,
        dino_config=dino_config,
        calidet_config=cached_config
        if sched['init'] == 'cached' else calidet_config,
        dino_ckpt=osp.join(dino_dir, f'iter_{sched["dino"]}.pth'),
        calidet_ckpt=osp.join(cali_dir, f'iter_{sched["calidet"]}.pth'),
        seconds=secs)


def trained_config(work_dir: str, config: str) -> str:
    """The config a training in ``work_dir`` ran with: the copy that
    mmengine dumps there (with every ``--cfg-options``/``--calidet-options``
    applied, e.g. a changed CaliFormer depth), else ``config``."""
    dumped = osp.join(work_dir, osp.basename(config))
    return dumped if osp.isfile(dumped) else config


def _eval_args(trained: Dict, out_dir: str, no_progress: bool):
    from mmcalidet.evaluation.tool_utils import add_model_args
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    add_model_args(parser)
    argv = [
        trained_config(trained['calidet_dir'], trained['calidet_config']),
        trained['calidet_ckpt'], '--baseline-config',
        trained_config(trained['dino_dir'], trained['dino_config']),
        '--baseline-checkpoint', trained['dino_ckpt'],
        '--posthoc', 'reweight', 'cooccurrence', '--out-dir', out_dir
    ] + (['--no-progress'] if no_progress else [])
    return parser.parse_args(argv)


def _pct(v: Optional[float]) -> str:
    if v is None or v != v:
        return '-'
    return f'{100 * v:.1f}'


def evaluate_all(args, trained: Dict, out_dir: str, data_meta: Dict,
                 quick: bool) -> Dict:
    """Every table and plot of the benchmark, from one decoder cache per
    detector (all sites' val images)."""
    import numpy as np

    from mmcalidet.evaluation import (STANDARD_PRIORS, build_priors,
                                      cache_evaluator, check_expected_order,
                                      evaluate_priors, evaluate_subsets,
                                      markdown_table, self_calibrate)
    from mmcalidet.evaluation import evaluate_groups, read_image_groups
    from mmcalidet.evaluation.sweep import metric_columns
    from mmcalidet.evaluation.tool_utils import EvalSetup
    from mmcalidet.priors import batch_prior, prior_mae
    from mmcalidet.visualization import (plot_prior_comparison,
                                         plot_prior_sweep,
                                         plot_self_calibration,
                                         plot_site_results,
                                         plot_subset_results)
    os.environ['MMCALIDET_CS_DATA'] = osp.abspath(args.data)
    eargs = _eval_args(trained, out_dir, args.no_progress)
    timings = {}
    start = time.perf_counter()
    setup = EvalSetup(eargs)
    timings['cache'] = time.perf_counter() - start
    if setup.info.get('shared_cache'):
        print('[eval] the CaliDINO keeps the DINO\'s trunk: one decoder '
              'cache serves both', flush=True)
    evaluate = cache_evaluator(setup.evaluator)
    e_t = setup.train_prior
    cache = setup.cache
    labels = cache.gt_label_lists()
    methods = setup.methods
    progress = not args.no_progress

    # 1. the standard injection table (all sites)
    t0 = time.perf_counter()
    specs = build_priors(STANDARD_PRIORS, labels, e_t, cache.batch_ids,
                         None, setup.classes)
    prior_rows = evaluate_priors(methods, specs, evaluate, progress)
    orders = {
        m.name: check_expected_order(prior_rows, m.name)
        for m in methods if m.takes_prior
    }
    timings['injection'] = time.perf_counter() - t0

    # 2. per site: E_t vs the site's own statistics
    t0 = time.perf_counter()
    groups = read_image_groups(
        osp.join(args.data, 'annotations', 'instances_val.json'),
        cache.img_ids())
    order = [s for s in SITES if s in set(groups)] + sorted(
        set(groups) - set(SITES))
    site_rows = evaluate_groups(methods, evaluate, e_t, groups, order)
    timings['sites'] = time.perf_counter() - t0
    # each site's images and own statistics E_site, for the steps below
    garr = np.asarray(groups)
    site_idx = {site: np.flatnonzero(garr == site) for site in order}
    site_prior = {
        site: batch_prior(e_t.shape[0], [labels[i] for i in idx])
        for site, idx in site_idx.items()
    }

    # 3. subsets (the paper's Tab. 3 layout)
    subset_rows = []
    if not quick:
        t0 = time.perf_counter()
        subset_rows = evaluate_subsets(
            methods, evaluate, e_t, SUBSET_SIZES, progress=progress)
        timings['subsets'] = time.perf_counter() - t0

    # 4. self-calibration on each site, from E_t
    t0 = time.perf_counter()
    curves, selfcal_rows = {}, []
    for site, idx in site_idx.items():
        for m in methods:
            if not m.takes_prior:
                continue
            res = self_calibrate(
                m.rescorer.model,
                m.cache,
                iters=args.self_cal_iters,
                score_thr=args.score_thr,
                tol=0,
                init_prior=e_t,
                evaluate=(lambda p, idx=idx, c=m.cache: evaluate(c, p, idx)),
                indices=idx,
                correction=m.rescorer.correction,
                batch_size=eargs.rescore_batch_size)
            curves[f'{m.name}, {site}'] = res.history
            selfcal_rows.append(
                dict(
                    site=site,
                    method=m.name,
                    epsilon=prior_mae(site_prior[site], e_t),
                    AP_start=res.history[0]['AP'],
                    AP_end=res.history[-1]['AP'],
                    gain=res.history[-1]['AP'] - res.history[0]['AP'],
                    epsilon_end=prior_mae(res.prior, site_prior[site])))
    timings['self_calibration'] = time.perf_counter() - t0

    # tables
    cols = [('method', 'method', ''), ('prior', 'prior', ''),
            ('oracle', 'oracle', '')] + metric_columns()
    injection_md = markdown_table(
        [dict(r, oracle='yes' if r['oracle'] else '') for r in prior_rows],
        cols)
    site_md = markdown_table(site_rows, [('site', 'site', ''),
                                         ('num_images', 'images', ''),
                                         ('epsilon', 'epsilon', '.3f'),
                                         ('method', 'method', ''),
                                         ('prior', 'prior', '')] +
                             metric_columns() +
                             [('gain_AP', 'AP gain', 'gain')])
    subset_md = markdown_table(subset_rows, [('size', 'subset size', ''),
                                             ('num_subsets', 'subsets', ''),
                                             ('method', 'method', ''),
                                             ('prior', 'prior', ''),
                                             ('epsilon', 'epsilon', '.3f')] +
                               metric_columns() +
                               [('gain_AP', 'AP gain', 'gain')]) \
        if subset_rows else ''
    selfcal_md = markdown_table(selfcal_rows,
                                [('site', 'site', ''),
                                 ('method', 'method', ''),
                                 ('epsilon', 'epsilon(E_site, E_t)', '.3f'),
                                 ('AP_start', 'AP(E_t)', 'pct'),
                                 ('AP_end', 'AP(E_c)', 'pct'),
                                 ('gain', 'gain', 'gain'),
                                 ('epsilon_end', 'epsilon(E_site, E_c)',
                                  '.3f')])
    verdicts = claims(prior_rows, site_rows, selfcal_rows, orders)

    # plots
    plots = [
        plot_prior_sweep(prior_rows, osp.join(out_dir, 'priors.png')),
        plot_site_results(site_rows, osp.join(out_dir, 'sites.png')),
        plot_self_calibration(
            curves, osp.join(out_dir, 'self_calibration.png'),
            title='Self-calibration per site (from E_t)'),
    ]
    if subset_rows:
        plots.append(
            plot_subset_results(subset_rows,
                                osp.join(out_dir, 'subsets.png')))
    for site in order:
        plots.append(
            plot_prior_comparison(
                e_t,
                site_prior[site],
                osp.join(out_dir, f'prior_{site}.png'),
                names=('E_t', f'E_{site}'),
                classes=setup.classes))
    return dict(
        injection=prior_rows,
        injection_md=injection_md,
        orders=orders,
        sites=site_rows,
        sites_md=site_md,
        subsets=subset_rows,
        subsets_md=subset_md,
        self_calibration=selfcal_rows,
        self_calibration_md=selfcal_md,
        curves=curves,
        claims=verdicts,
        plots=plots,
        timings=timings,
        num_images=len(cache),
        data_epsilon=data_meta.get('epsilon', {}))


def claims(prior_rows, site_rows, selfcal_rows, orders) -> List[str]:
    """The issue's claims, each with its numbers and a verdict."""
    from mmcalidet.evaluation import format_order_verdict
    out = [
        f'expected order, {method}: {" <= ".join(order["order"])}: '
        f'**{format_order_verdict(order)}**'
        for method, order in orders.items()
    ]
    ap = {(r['method'], r.get('key') or '-'): r['AP'] for r in prior_rows}
    cali = next((m for m, _ in ap if m.startswith('Cali')), None)
    plain = next((m for m, k in ap if k == '-'), None)
    if cali:
        v = {k: ap.get((cali, k)) for k in
             ('flip_E_x', 'E0', 'E_t', 'E_b', 'E_x')}
        if all(x is not None for x in v.values()):
            ok = (v['flip_E_x'] < v['E0'] <= v['E_t'] <= v['E_b'] < v['E_x'])
            spread = 100 * (v['E_x'] - v['flip_E_x'])
            out.append(
                'AP(flip E_x) < AP(E0) <= AP(E_t) <= AP(E_b) < AP(E_x): '
                + ' / '.join(f'{100 * v[k]:.2f}' for k in v) +
                f': **{"holds" if ok else "does not hold"}** (AP(E_x) - '
                f'AP(flip E_x) = {spread:+.2f}; the paper: +16.11 on COCO)')
        if plain and (plain, '-') in ap and v['E_t'] is not None:
            d = v['E_t'] - ap[(plain, '-')]
            out.append(
                f'AP(E_t) of {cali} vs {plain}: {_pct(v["E_t"])} vs '
                f'{_pct(ap[(plain, "-")])} ({100 * d:+.1f}): '
                f'**{"at least" if d >= -0.005 else "below"} AP({plain}) '
                '- 0.5**')
    for r in site_rows:
        if r['prior'] == 'E_site' and r['method'].startswith('Cali'):
            out.append(
                f'site {r["site"]} (epsilon {r["epsilon"]:.3f}): E_site vs '
                f'E_t {100 * r["gain_AP"]:+.1f} AP')
    for r in selfcal_rows:
        out.append(f'self-calibration, {r["method"]}, site {r["site"]}: '
                   f'{_pct(r["AP_start"])} -> {_pct(r["AP_end"])} AP '
                   f'({100 * r["gain"]:+.1f})')
    return out


def write_results(out_dir: str, results: Dict, trained: Dict,
                  sched: Dict, argv: Sequence[str], total: float) -> str:
    """results.md and results.json."""
    from mmcalidet.evaluation.report import _json_safe
    from mmcalidet.utils.file_io import atomic_write
    t = results['timings']
    secs = trained['seconds']
    machine = (f'{platform.machine()}, {os.cpu_count()} CPU cores, '
               f'torch threads {_torch_threads()}, Python '
               f'{platform.python_version()}')
    cmd = 'python tools/analysis_tools/context_shift_benchmark.py ' + \
        ' '.join(argv)
    parts = [
        '# Context-shift benchmark results', '',
        f'Command: `{cmd.strip()}`', '', f'Machine: {machine}', '',
        f'Schedule: plain DINO {sched["dino"]} iterations of 4 images (lr '
        f'x0.1 at {sched["decay"]}); ' + (
            'CaliDINO the same schedule from scratch.'
            if sched['init'] == 'scratch' else
            f'CaliDINO: {sched["calidet"]} CaliFormer updates on the final '
            'DINO\'s cached decoder outputs (lr x0.1 at update '
            f'{sched["calidet_decay"]}; the trunk stays the DINO\'s).'
            if sched['init'] == 'cached' else
            f'CaliDINO {sched["calidet"]} iterations from the DINO\'s '
            f'iteration {sched["start"]} (lr x0.1 at its iteration '
            f'{sched["calidet_decay"]}).'), '',
        'Wall-clock: DINO training '
        f'{_mins(secs["dino"])}, CaliDINO training {_mins(secs["calidet"])}'
        f', decoder caches {t["cache"]:.0f} s, injection table '
        f'{t["injection"]:.0f} s, sites {t["sites"]:.0f} s, '
        + (f'subsets {t["subsets"]:.0f} s, ' if 'subsets' in t else '') +
        f'self-calibration {t["self_calibration"]:.0f} s; '
        f'{_mins(total)} in all (0 = reused).', '',
        '## Claims', '', '\n'.join(f'- {c}' for c in results['claims']), '',
        f'## Injected priors ({results["num_images"]} val images, all '
        'sites)', '', results['injection_md'], '', '![](priors.png)', '',
        '## Deployment sites: E_t vs the site prior', '',
        results['sites_md'], '', '![](sites.png)', ''
    ]
    if results['subsets_md']:
        parts += [
            '## Subsets (E_b of each subset vs E_t)', '',
            results['subsets_md'], '', '![](subsets.png)', ''
        ]
    parts += [
        '## Self-calibration per site (from E_t, '
        f'{len(next(iter(results["curves"].values()))) - 1} iterations)', '',
        results['self_calibration_md'], '', '![](self_calibration.png)', ''
    ]
    path = osp.join(out_dir, 'results.md')
    with atomic_write(path) as f:
        f.write('\n'.join(parts))
    data = {k: v for k, v in results.items() if not k.endswith('_md')}
    data.update(schedule=sched, training_seconds=secs, machine=machine,
                command=cmd.strip())
    with atomic_write(osp.join(out_dir, 'results.json')) as f:
        json.dump(_json_safe(data), f, indent=1)
    return path


def _mins(s: float) -> str:
    return f'{s / 60:.1f} min' if s else 'reused'


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    start = time.perf_counter()
    sched = schedule(args)
    args.data = args.data or VARIANTS[args.variant]['data']
    work_dir = args.work_dir or osp.join(
        'work_dirs', 'context_shift' +
        ('' if args.variant == 'digits' else '_' + args.variant) +
        ('_quick' if args.quick else ''))
    out_dir = args.out_dir or osp.join(work_dir, 'results')
    meta = ensure_data(args)
    trained = train_both(args, sched, work_dir)
    if args.train_only:
        return 0
    os.makedirs(out_dir, exist_ok=True)
    print('[eval] caching decoder outputs and evaluating', flush=True)
    results = evaluate_all(args, trained, out_dir, meta, args.quick)
    path = write_results(out_dir, results, trained, sched, argv,
                         time.perf_counter() - start)
    print('\n' + results['injection_md'] + '\n')
    print(results['sites_md'] + '\n')
    print(results['self_calibration_md'] + '\n')
    print('\n'.join(f'- {c}' for c in results['claims']))
    print(f'\nwrote {path} and {len(results["plots"])} plots '
          f'({(time.perf_counter() - start) / 60:.1f} min)')
    return 0


if __name__ == '__main__':
    run_tool(main)
