# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark end to end: generate the data, train the
plain tiny DINO and the tiny CaliDINO (calibrated on the DINO's cached
decoder outputs, or fine-tuned from it), and evaluate them
(injection table, per-site table, subset table, self-calibration per site,
post-hoc baselines on the plain DINO).

    python tools/analysis_tools/context_shift_benchmark.py            # full
    python tools/analysis_tools/context_shift_benchmark.py --quick    # short
    python tools/analysis_tools/context_shift_benchmark.py --quick \
        --dino-iters 600 --posthoc reweight --out-dir outputs/demo    # demo

Full: 3000 DINO iterations, then the CaliDINO's CaliFormer learns from
the final DINO's cached decoder outputs for 10,000 updates (the trunk stays
the DINO's; ``configs/context_shift/*_cached.py``). ``--quick``: 900 DINO
iterations and 3,000 updates, no subset table (``make demo`` also trains
the DINO only 600 iterations and leaves out the co-occurrence rescoring).
``--calidet-init finetune`` fine-tunes the whole CaliDINO from the final
DINO instead (the paper's recipe, ``--finetune-iters``),
``same-budget|scratch`` start it otherwise. ``--variant many-class`` runs
the 40-class data. Steps already done are reused: the data folder, and a
work folder holding the last checkpoint of a training with the same model,
optimizer, schedule and init (``--retrain`` trains again).
Evaluation builds each model from the config its training dumped and runs
the library's protocol (``mmcalidet.evaluation``: ``EvalSetup``, the
injection table, ``evaluate_groups`` per site, ``evaluate_subsets``,
``self_calibrate_partitions`` per site). Writes ``results.md``,
``results.json`` and the plots to ``--out-dir`` (default
``<work-dir>/results``).
"""
import argparse
import os
import os.path as osp
import platform
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmcalidet.evaluation.baselines import (CORRECTION_NAMES,  # noqa: E402
                                            CORRECTIONS)
from mmcalidet.evaluation.self_calibration import (  # noqa: E402
    DEFAULT_REFERENCE_IMAGES)
from mmcalidet.utils.cli import run_tool  # noqa: E402

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _benchmark_training import (VARIANTS, ensure_data,  # noqa: E402
                                 ran_schedule, schedule, train_both,
                                 trained_config)
from _eval_args import score_threshold  # noqa: E402

SITES = ('like_train', 'left_only', 'crossed')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Context-shift benchmark: generate, train, evaluate')
    parser.add_argument(
        '--quick',
        action='store_true',
        help='the short version (the DINO 900 iterations, then 3,000 '
        'calibrator updates or a 300-iteration fine-tune; no subset table)')
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
        '--calibrator-config',
        help='the calibrator config of --calidet-init cached (default the '
        'variant\'s configs/context_shift/calidet_dino_tiny_context-shift'
        '[_many-class]_cached.py), e.g. the filled recipe, '
        'calidet_dino_tiny_context-shift_cached_filled.py')
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
        type=score_threshold,
        default=0.3,
        help='self-calibration score threshold: a number, or "fit": per '
        'method the threshold at which its predictions\' statistics on '
        '--reference-images training images lie closest to theirs')
    parser.add_argument(
        '--self-cal-bias',
        action='store_true',
        help='self-calibration takes off E_i the bias its statistics show '
        'on the --reference-images training images')
    parser.add_argument(
        '--reference-images',
        type=int,
        default=DEFAULT_REFERENCE_IMAGES,
        help='training images (a fixed random sample) that --score-thr fit '
        'and --self-cal-bias measure the predictions on')
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
        '--posthoc',
        nargs='*',
        choices=CORRECTIONS,
        default=list(CORRECTIONS),
        help='post-hoc prior corrections of the plain DINO to compare with '
        '(default: ' + ' and '.join(CORRECTION_NAMES[c]
                                     for c in CORRECTIONS) +
        '; no value: the plain DINO alone). Each costs about a third of '
        'the evaluation')
    parser.add_argument(
        '--dino-work-dir',
        help='the plain DINO training to use (trained there if missing; '
        'default <work-dir>/dino): ablations of the CaliDINO share one')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bars')
    args = parser.parse_args(argv)
    if args.reference_images < 1:
        parser.error('--reference-images must be at least 1')
    return args


def _pct(v: Optional[float]) -> str:
    if v is None or v != v:
        return '-'
    return f'{100 * v:.1f}'


def evaluate_all(args, trained: Dict, out_dir: str, data_meta: Dict,
                 quick: bool) -> Dict:
    """Every table and plot of the benchmark, from one decoder cache per
    detector (all sites' val images)."""
    from mmcalidet.evaluation import (STANDARD_PRIORS, SUBSET_SIZES,
                                      EvalSetup, build_priors,
                                      cache_evaluator, check_expected_order,
                                      evaluate_groups, evaluate_priors,
                                      evaluate_subsets, markdown_table,
                                      read_image_groups,
                                      self_calibrate_partitions, site_priors,
                                      start_diagnostics)
    from mmcalidet.evaluation.partitions import group_partitions
    from mmcalidet.evaluation.report import injection_table, metric_columns
    from mmcalidet.visualization import (plot_prior_comparison,
                                         plot_prior_sweep,
                                         plot_self_calibration,
                                         plot_site_results,
                                         plot_subset_results)
    import torch
    os.environ['MMCALIDET_CS_DATA'] = osp.realpath(args.data)
    progress = not args.no_progress
    timings = {}
    start = time.perf_counter()
    setup = EvalSetup(
        trained_config(trained['calidet_dir'], trained['calidet_config']),
        trained['calidet_ckpt'],
        baseline_config=trained_config(trained['dino_dir'],
                                       trained['dino_config']),
        baseline_checkpoint=trained['dino_ckpt'],
        posthoc=args.posthoc,
        device='cuda' if torch.cuda.is_available() else 'cpu',
        progress=progress)
    timings['cache'] = time.perf_counter() - start
    if setup.info.get('shared_cache'):
        print('[eval] the CaliDINO keeps the DINO\'s trunk: one decoder '
              'cache serves both', flush=True)
    evaluate = cache_evaluator(setup.evaluator)
    e_t, cache, methods = setup.train_prior, setup.cache, setup.methods
    labels = cache.gt_label_lists()

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
    site_prior = site_priors(labels, groups, len(e_t), order)
    site_rows = evaluate_groups(methods, evaluate, e_t, groups, order,
                                site_prior)
    timings['sites'] = time.perf_counter() - t0
    sites = group_partitions(groups, order)

    # 3. subsets (the paper's Tab. 3 layout)
    subset_rows = []
    if not quick:
        t0 = time.perf_counter()
        subset_rows = evaluate_subsets(
            methods, evaluate, e_t, SUBSET_SIZES, progress=progress)
        timings['subsets'] = time.perf_counter() - t0

    # 4. self-calibration on each site, from E_t
    t0 = time.perf_counter()
    calibrated = [m for m in methods if m.takes_prior]
    references = {}
    if args.score_thr == 'fit' or args.self_cal_bias:
        references = fit_references(args, calibrated, e_t, setup.classes,
                                    progress)
    thr = {
        m.name: references[m.name].score_thr
        if args.score_thr == 'fit' else args.score_thr
        for m in calibrated
    }
    runs = {
        m.name: self_calibrate_partitions(
            m.rescorer.model,
            m.cache,
            list(sites.values()),
            evaluate=evaluate,
            iters=args.self_cal_iters,
            score_thr=thr[m.name],
            tol=0,
            init_prior=e_t,
            correction=m.rescorer.correction,
            batch_size=setup.rescore_batch_size,
            stats_bias=references[m.name].bias
            if args.self_cal_bias else None)['results']
        for m in calibrated
    }
    curves, selfcal_rows = {}, []
    by_name = {m.name: m for m in methods}
    for i, (site, idx) in enumerate(sites.items()):
        for name, results in runs.items():
            res, rescorer = results[i], by_name[name].rescorer
            curves[f'{name}, {site}'] = res.history
            first, last = res.history[0]['AP'], res.history[-1]['AP']
            # what the detector's own predictions know before any feedback
            known = start_diagnostics(res, [labels[j] for j in idx],
                                      site_prior[site], e_t, thr[name])
            estimate = evaluate(by_name[name].cache,
                                rescorer.predict(res.start_estimate,
                                                 idx), idx)['AP']
            selfcal_rows.append(
                dict(
                    site=site,
                    method=name,
                    score_thr=thr[name],
                    epsilon=known.pop('epsilon_start'),
                    AP_start=first,
                    AP_end=last,
                    gain=last - first,
                    AP_estimate=estimate,
                    **known))
    timings['self_calibration'] = time.perf_counter() - t0

    def table(rows, keys, gain=True):
        return markdown_table(rows, keys + metric_columns() + (
            [('gain_AP', 'AP gain', 'gain')] if gain else []))

    results = dict(
        injection=prior_rows,
        injection_md=injection_table(prior_rows),
        orders=orders,
        sites=site_rows,
        sites_md=table(site_rows, [('site', 'site', ''),
                                   ('num_images', 'images', ''),
                                   ('epsilon', 'epsilon', '.3f'),
                                   ('method', 'method', ''),
                                   ('prior', 'prior', '')]),
        subsets=subset_rows,
        subsets_md=table(subset_rows, [('size', 'subset size', ''),
                                       ('num_subsets', 'subsets', ''),
                                       ('method', 'method', ''),
                                       ('prior', 'prior', ''),
                                       ('epsilon', 'epsilon', '.3f')])
        if subset_rows else '',
        self_calibration=selfcal_rows,
        self_calibration_md=markdown_table(
            selfcal_rows, [('site', 'site', ''), ('method', 'method', ''),
                           ('score_thr', 'score threshold', '.2f'),
                           ('epsilon', 'epsilon(E_site, E_t)', '.3f'),
                           ('AP_start', 'AP(E_t)', 'pct'),
                           ('AP_end', 'AP(E_c)', 'pct'),
                           ('gain', 'gain', 'gain'),
                           ('epsilon_end', 'epsilon(E_site, E_c)', '.3f'),
                           ('presence_precision', 'presence precision', '.2f'),
                           ('presence_recall', 'presence recall', '.2f'),
                           ('epsilon_estimate', 'epsilon(E_site, E_i)', '.3f'),
                           ('shift_seen_estimate', 'shift seen by E_i', '.2f'),
                           ('added_seen_estimate', 'added seen', '.2f'),
                           ('removed_seen_estimate', 'removed seen', '.2f'),
                           ('AP_estimate', 'AP(E_i)', 'pct')]),
        curves=curves,
        references={
            name: dict(score_thr=ref.score_thr, num_images=ref.num_images,
                       rows=ref.rows)
            for name, ref in references.items()
        },
        claims=claims(prior_rows, site_rows, selfcal_rows, orders))
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
    for site in sites:
        plots.append(
            plot_prior_comparison(
                e_t,
                site_prior[site],
                osp.join(out_dir, f'prior_{site}.png'),
                names=('E_t', f'E_{site}'),
                classes=setup.classes))
    return dict(
        results,
        plots=plots,
        timings=timings,
        num_images=len(cache),
        data_epsilon=data_meta.get('epsilon', {}))


def fit_references(args, methods: Sequence, e_t, classes: Sequence[str],
                   progress: bool) -> Dict:
    """Per method, how its predictions under E_t err on a fixed random
    sample of the training images (``--reference-images``): the score
    threshold that fits them best and the bias of their statistics
    (:func:`mmcalidet.evaluation.method_references`)."""
    from mmcalidet.evaluation import (method_references,
                                      sample_annotated_images)
    paths, labels = sample_annotated_images(
        osp.join(args.data, 'annotations', 'instances_train.json'),
        osp.join(args.data, 'images'), classes, args.reference_images)
    print(f'[eval] {len(paths)} training images for the self-calibration '
          'reference', flush=True)
    out = method_references(methods, paths, labels, e_t, progress)
    for name, ref in out.items():
        print(f'[eval] {name}: score threshold {ref.score_thr:.2f} fits '
              'the training images best', flush=True)
    return out


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
    import torch

    from mmcalidet.evaluation import write_report
    t, secs = results['timings'], trained['seconds']
    machine = (f'{platform.machine()}, {os.cpu_count()} CPU cores, '
               f'torch threads {torch.get_num_threads()}, Python '
               f'{platform.python_version()}')
    cmd = ('python tools/analysis_tools/context_shift_benchmark.py ' +
           ' '.join(argv)).strip()
    calidet = ('CaliDINO the same schedule from scratch.'
               if sched['init'] == 'scratch' else
               f'CaliDINO: {sched["calidet"]} CaliFormer updates on the '
               'final DINO\'s cached decoder outputs ('
               f'{_decay(sched["calidet_decay"], "update")}; the trunk '
               'stays the DINO\'s).' if sched['init'] == 'cached' else
               f'CaliDINO {sched["calidet"]} iterations from the DINO\'s '
               f'iteration {sched["start"]} '
               f'({_decay(sched["calidet_decay"], "its iteration")}).')
    iters = len(next(iter(results['curves'].values()))) - 1
    sections = [
        (None, f'Command: `{cmd}`'), (None, f'Machine: {machine}'),
        (None, f'Schedule: plain DINO {sched["dino"]} iterations of 4 '
         f'images ({_decay(sched["decay"])}); ' + calidet),
        (None, f'Wall-clock: DINO training {_mins(secs["dino"])}, CaliDINO '
         f'training {_mins(secs["calidet"])}, decoder caches '
         f'{t["cache"]:.0f} s, injection table {t["injection"]:.0f} s, '
         f'sites {t["sites"]:.0f} s, ' +
         (f'subsets {t["subsets"]:.0f} s, ' if 'subsets' in t else '') +
         f'self-calibration {t["self_calibration"]:.0f} s; {_mins(total)} '
         'in all (0 = reused).'),
        ('Claims', '\n'.join(f'- {c}' for c in results['claims'])),
        (f'Injected priors ({results["num_images"]} val images, all sites)',
         results['injection_md'] + '\n\n![](priors.png)'),
        ('Deployment sites: E_t vs the site prior',
         results['sites_md'] + '\n\n![](sites.png)')
    ]
    if results['subsets_md']:
        sections.append(('Subsets (E_b of each subset vs E_t)',
                         results['subsets_md'] + '\n\n![](subsets.png)'))
    sections.append(
        (f'Self-calibration per site (from E_t, {iters} iterations)',
         results['self_calibration_md'] + '\n\n![](self_calibration.png)'))
    data = {k: v for k, v in results.items() if not k.endswith('_md')}
    data.update(schedule=sched, training_seconds=secs, machine=machine,
                command=cmd)
    return write_report(out_dir, 'results', 'Context-shift benchmark results',
                        sections, data)[0]


def _decay(at: Optional[int], unit: str = '') -> str:
    """'lr x0.1 at [<unit> ]<at>', or 'a constant lr' (``at`` None)."""
    if at is None:
        return 'a constant lr'
    return f'lr x0.1 at {unit} {at}' if unit else f'lr x0.1 at {at}'


def _mins(s: float) -> str:
    return f'{s / 60:.1f} min' if s else 'reused'


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    start = time.perf_counter()
    sched = schedule(args)
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
    meta = ensure_data(args)
    trained = train_both(args, sched, work_dir)
    if args.train_only:
        return 0
    sched = ran_schedule(sched, trained)
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
