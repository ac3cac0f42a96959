# Copyright (c) mmcalidet contributors. All rights reserved.
"""The benchmark's evaluation: every table, plot and claim from the trained
DINO and CaliDINO, through :mod:`mmcalidet.evaluation`'s protocol
(``EvalSetup``, the injection table, ``evaluate_groups`` per site,
``evaluate_subsets``, ``self_calibrate_partitions`` per site)."""
import argparse
import os
import os.path as osp
import platform
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from mmcalidet.priors import prior_mae
from .online import stream_site
from .training import trained_config

#: the deployment sites, in table order
SITES = ('like_train', 'left_only', 'crossed', 'swapped')


def _pct(v: Optional[float]) -> str:
    if v is None or v != v:
        return '-'
    return f'{100 * v:.1f}'


def evaluate_all(args: argparse.Namespace,
                 trained: Dict,
                 out_dir: str,
                 data_meta: Dict,
                 quick: bool,
                 log_file: Optional[str] = None) -> Dict:
    """Every table and plot of the benchmark, from one decoder cache per
    detector (all sites' val images), through the library's protocol.

    Args:
        args (argparse.Namespace): the benchmark's arguments (``data``,
            ``posthoc``, ``self_cal_iters``, ``score_thr``,
            ``no_progress``).
        trained (dict): :func:`train_both`'s result.
        out_dir (str): where the plots go.
        data_meta (dict): the data folder's ``meta.json``.
        quick (bool): leave out the subset table.
        log_file (str, optional): where what the libraries print while
            the models load goes (default: nowhere).

    Returns:
        dict: the rows and markdown of every table, the self-calibration
        curves, the claims, the plots written and the timings.
    """
    import torch

    from mmcalidet.evaluation import (CONTENT_PRIORS, DEFAULT_TRUST_RADIUS,
                                      STANDARD_PRIORS, SUBSET_SIZES,
                                      SWEEP_ALPHAS, EvalSetup, build_priors,
                                      cache_evaluator, check_expected_order,
                                      deployment_gains, evaluate_groups,
                                      evaluate_priors, evaluate_subsets,
                                      markdown_table, read_image_groups,
                                      self_calibrate_partitions,
                                      shrinkage_sweep, site_priors)
    from mmcalidet.evaluation.partitions import group_partitions
    from mmcalidet.evaluation.prior_support import register_label_supports
    from mmcalidet.evaluation.report import injection_table, metric_columns
    from mmcalidet.evaluation.site_prior import DEFAULT_ACCEPT
    from mmcalidet.utils.log_level import library_output_to
    from mmcalidet.visualization import (plot_prior_comparison,
                                         plot_prior_sweep,
                                         plot_self_calibration,
                                         plot_shrinkage_sweep,
                                         plot_site_results,
                                         plot_subset_results)
    os.environ['MMCALIDET_CS_DATA'] = osp.realpath(args.data)
    progress = not args.no_progress
    timings = {}
    start = time.perf_counter()
    # what the libraries print while the models load (pycocotools' index,
    # mmengine's checkpoint lines, warnings) goes to the log, not the
    # console
    with library_output_to(log_file or os.devnull):
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
        print(
            '[eval] the CaliDINO keeps the DINO\'s trunk: one decoder '
            'cache serves both',
            flush=True)
    evaluate = cache_evaluator(setup.evaluator)
    e_t, cache, methods = setup.train_prior, setup.cache, setup.methods
    # each (prior, image set) the tables share (E_t and E_site of a site:
    # the site table, the deployment rows' baseline, the sweep's alpha 0
    # and 1, the online rows' start) is scored and evaluated once
    setup.evaluator.remember()
    for m in methods:
        m.rescorer.remember()
    labels = cache.gt_label_lists()
    groups = read_image_groups(
        osp.join(args.data, 'annotations', 'instances_val.json'),
        cache.img_ids())
    order = [s for s in SITES if s in set(groups)
             ] + sorted(set(groups) - set(SITES))
    site_prior = site_priors(labels, groups, len(e_t), order)
    sites = group_partitions(groups, order)
    # a CaliFormer that reads a prior's support (experimental) is told
    # what each label-built prior was measured on; no-op otherwise
    for m in methods:
        register_label_supports(
            m.rescorer,
            labels,
            e_t,
            setup.train_meta,
            setup.classes,
            cache.batch_ids,
            sites={s: (site_prior[s], sites[s])
                   for s in sites},
            sweep_alphas=SWEEP_ALPHAS)

    # 1. the standard injection table (all sites)
    t0 = time.perf_counter()
    # the paper's priors, then E_x and flip(E_x) without their presence
    # pattern (does the detector read the relations themselves?)
    names = STANDARD_PRIORS + ('filled_flip_E_x', 'filled_E_x')
    specs = build_priors(names, labels, e_t, cache.batch_ids, None,
                         setup.classes)
    prior_rows = evaluate_priors(methods, specs, evaluate, progress)
    orders = {
        m.name: check_expected_order(prior_rows, m.name)
        for m in methods if m.takes_prior
    }
    content_orders = {
        m.name: check_expected_order(prior_rows, m.name, CONTENT_PRIORS)
        for m in methods if m.takes_prior
    }
    timings['injection'] = time.perf_counter() - t0

    # 2. per site: E_t vs the site's own statistics
    t0 = time.perf_counter()
    site_rows = evaluate_groups(methods, evaluate, e_t, groups, order,
                                site_prior)
    timings['sites'] = time.perf_counter() - t0

    # 2b. per site, as a user deploys: a prior estimated from a few
    # labelled site images (raw, and fitted toward E_t by cross-validation),
    # scored on the site's other images against E_t
    t0 = time.perf_counter()
    deployment_rows = []
    repeats = getattr(args, 'fit_repeats', 0)
    labelled = args.fit_labelled
    labelled = [labelled] if isinstance(labelled, int) else list(labelled)
    for site, idx, n in ((s, i, n) for s, i in sites.items() if repeats
                         for n in labelled):
        # a small site keeps at least one image to evaluate on
        num = min(n, len(idx) - 1)
        if num < 2:
            continue
        for m in (m for m in methods if m.takes_prior):
            # the fits' candidate priors are scored once each: keep none
            with m.rescorer.keeping_none():
                res = deployment_gains(
                    m.rescorer,
                    setup.evaluator,
                    e_t,
                    idx,
                    num_labelled=num,
                    repeats=repeats,
                    progress=progress,
                    desc=f'site prior draws ({site}, {m.name})',
                    accept=getattr(args, 'fit_accept', DEFAULT_ACCEPT))
            for prior in ('raw', 'fitted'):
                deployment_rows.append(
                    dict(
                        site=site,
                        method=m.name,
                        prior=f'E_site({num}) {prior}',
                        labelled=num,
                        gain=res[prior]['mean'],
                        low=res[prior]['low'],
                        high=res[prior]['high'],
                        interval=f'[{res[prior]["low"]:+.2f}, '
                        f'{res[prior]["high"]:+.2f}]',
                        alpha=float(np.mean(res['alphas']))
                        if prior == 'fitted' else None,
                        repeats=repeats,
                        gains=res[prior]['gains']))
    timings['deployment'] = time.perf_counter() - t0

    # 2c. per site, the dense sweep E_t + alpha (E_site - E_t): does the
    # detector read the direction of the site's shift?
    t0 = time.perf_counter()
    sweep_rows = [
        dict(row, site=site, method=m.name) for site, idx in sites.items()
        for m in methods if m.takes_prior
        for row in shrinkage_sweep(m.rescorer, setup.evaluator, e_t,
                                   site_prior[site], idx)
    ]
    timings['sweep'] = time.perf_counter() - t0

    # 3. subsets (the paper's Tab. 3 layout)
    subset_rows = []
    if not quick:
        t0 = time.perf_counter()
        subset_rows = evaluate_subsets(
            methods, evaluate, e_t, SUBSET_SIZES, progress=progress)
        timings['subsets'] = time.perf_counter() - t0

    # 4. self-calibration on each site, from E_t, within each asked trust
    # radius (None: the paper's unbounded loop)
    t0 = time.perf_counter()
    calibrated = [m for m in methods if m.takes_prior]
    radii = _as_list(
        getattr(args, 'self_cal_radius', None) or [DEFAULT_TRUST_RADIUS])
    runs = {(m.name, radius):
            self_calibrate_partitions(
                m.rescorer.model,
                m.cache,
                list(sites.values()),
                evaluate=evaluate,
                iters=args.self_cal_iters,
                score_thr=args.score_thr,
                tol=0,
                trust_radius=radius,
                init_prior=e_t,
                # a support-aware CaliFormer: E_c keeps E_t's support
                init_support=m.rescorer.support_of(e_t),
                correction=m.rescorer.correction,
                batch_size=setup.rescore_batch_size)['results']
            for m in calibrated for radius in radii}
    curves, selfcal_rows = {}, []
    by_name = {m.name: m for m in methods}
    for i, (site, idx) in enumerate(sites.items()):
        for (name, radius), results in runs.items():
            res, rescorer = results[i], by_name[name].rescorer
            label = '' if radius is None else f', radius {radius:g}'
            curves[f'{name}, {site}{label}'] = res.history
            first, last = res.history[0]['AP'], res.history[-1]['AP']
            estimate = evaluate(by_name[name].cache,
                                rescorer.predict(res.start_estimate, idx),
                                idx)['AP']
            selfcal_rows.append(
                dict(
                    site=site,
                    method=name,
                    score_thr=args.score_thr,
                    radius=radius,
                    epsilon=prior_mae(site_prior[site], e_t),
                    AP_start=first,
                    AP_end=last,
                    gain=last - first,
                    epsilon_end=prior_mae(site_prior[site], res.prior),
                    AP_estimate=estimate))
    timings['self_calibration'] = time.perf_counter() - t0

    # 5. online self-calibration on each site, streamed, per trust radius
    t0 = time.perf_counter()
    online_rows = []
    for radius in _as_list(
            getattr(args, 'online_radius', [DEFAULT_TRUST_RADIUS])):
        for m in calibrated:
            for site, idx in sites.items():
                run = stream_site(
                    m.rescorer,
                    evaluate,
                    idx,
                    e_t,
                    radius,
                    score_thr=args.score_thr)
                online_rows.append(
                    dict(
                        site=site,
                        method=m.name,
                        radius=radius,
                        AP_start=run['AP_start'],
                        AP_stream=run['AP_stream'],
                        gain=run['gain'],
                        updates=run['updates'],
                        epsilon_end=prior_mae(site_prior[site],
                                              run['prior'])))
    timings['online'] = time.perf_counter() - t0
    setup.evaluator.remember(False)
    for m in methods:
        m.rescorer.remember(False)

    def table(rows, keys, gain=True):
        return markdown_table(
            rows, keys + metric_columns() +
            ([('gain_AP', 'AP gain', 'gain')] if gain else []))

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
        deployment=deployment_rows,
        deployment_md=markdown_table(deployment_rows, [
            ('site', 'site', ''), ('method', 'method', ''),
            ('prior', 'prior', ''), ('gain', 'AP gain over E_t', '+.2f'),
            ('interval', '95 % interval (draws)', ''),
            ('alpha', 'mean alpha', '.2f')
        ]) if deployment_rows else '',
        sweep=sweep_rows,
        sweep_md=markdown_table(
            sweep_table(sweep_rows),
            [('site', 'site', ''), ('method', 'method', ''),
             ('AP_E_t', 'AP(E_t)', '.2f')] +
            [(f'alpha {a:g}', f'alpha {a:g}', '+.2f')
             for a in SWEEP_ALPHAS] + [('peak', 'peak at alpha', 'g')]),
        subsets=subset_rows,
        subsets_md=table(subset_rows, [('size', 'subset size', ''),
                                       ('num_subsets', 'subsets', ''),
                                       ('method', 'method', ''),
                                       ('prior', 'prior', ''),
                                       ('epsilon', 'epsilon',
                                        '.3f')]) if subset_rows else '',
        self_calibration=selfcal_rows,
        self_calibration_md=markdown_table(
            selfcal_rows, [('site', 'site', ''), ('method', 'method', ''),
                           ('score_thr', 'score threshold', '.2f'),
                           ('radius', 'trust radius', 'g'),
                           ('epsilon', 'epsilon(E_site, E_t)', '.3f'),
                           ('AP_start', 'AP(E_t)', 'pct'),
                           ('AP_end', 'AP(E_c)', 'pct'),
                           ('gain', 'gain', 'gain'),
                           ('epsilon_end', 'epsilon(E_site, E_c)', '.3f'),
                           ('AP_estimate', 'AP(E_i)', 'pct')]),
        online=online_rows,
        online_md=markdown_table(
            online_rows, [('site', 'site', ''), ('method', 'method', ''),
                          ('radius', 'trust radius', 'g'),
                          ('updates', 'updates', ''),
                          ('AP_start', 'AP(E_t)', 'pct'),
                          ('AP_stream', 'AP streamed', 'pct'),
                          ('gain', 'gain', 'gain'),
                          ('epsilon_end', 'epsilon(E_site, E_c)', '.3f')]),
        curves=curves,
        content_orders=content_orders,
        claims=claims(prior_rows, site_rows, selfcal_rows, orders,
                      deployment_rows, content_orders, sweep_rows))
    plots = [
        plot_prior_sweep(prior_rows, osp.join(out_dir, 'priors.png')),
        plot_site_results(site_rows, osp.join(out_dir, 'sites.png')),
        plot_shrinkage_sweep(sweep_rows, osp.join(out_dir, 'sweep.png')),
        plot_self_calibration(
            curves,
            osp.join(out_dir, 'self_calibration.png'),
            title='Self-calibration per site (from E_t)'),
    ]
    if subset_rows:
        plots.append(
            plot_subset_results(subset_rows, osp.join(out_dir, 'subsets.png')))
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


def sweep_table(rows: Sequence[Dict]) -> List[Dict]:
    """The sweep's rows pivoted: one per (site, method), the AP gain of
    each alpha as a column ``alpha <a>``, ``AP_E_t`` and ``peak`` (the
    alpha of the largest AP)."""
    table: Dict = {}
    for r in rows:
        row = table.setdefault((r['site'], r['method']),
                               dict(site=r['site'], method=r['method']))
        row[f'alpha {r["alpha"]:g}'] = r['gain']
        if r['alpha'] == 0:
            row['AP_E_t'] = r['AP']
        if 'peak' not in row or r['AP'] > row['_best']:
            row['peak'], row['_best'] = r['alpha'], r['AP']
    return [{k: v
             for k, v in row.items() if k != '_best'}
            for row in table.values()]


def claims(prior_rows,
           site_rows,
           selfcal_rows,
           orders,
           deployment_rows=(),
           content_orders=None,
           sweep_rows=()) -> List[str]:
    """The benchmark's claims, each with its numbers and a verdict.

    Args:
        prior_rows (list[dict]): the injection table's rows.
        site_rows (list[dict]): the per-site rows.
        selfcal_rows (list[dict]): the self-calibration rows.
        orders (dict): per method, :func:`check_expected_order`'s result.
        deployment_rows (list[dict]): the deployment rows (raw and fitted
            site priors from a few labelled images).
        content_orders (dict, optional): per method, the order filled
            flip(E_x) < E_t < filled E_x (``CONTENT_PRIORS``).
        sweep_rows (list[dict]): the shrinkage sweep per site.

    Returns:
        list[str]: one line per claim.
    """
    from mmcalidet.evaluation import format_order_verdict
    out = [
        f'expected order, {method}: {" <= ".join(order["order"])}: '
        f'**{format_order_verdict(order)}**'
        for method, order in orders.items()
    ]
    out += [
        f'reads relations, {method}: {" <= ".join(order["order"])}: '
        f'**{format_order_verdict(order)}**'
        for method, order in (content_orders or {}).items()
    ]
    ap = {(r['method'], r.get('key') or '-'): r['AP'] for r in prior_rows}
    cali = next((m for m, _ in ap if m.startswith('Cali')), None)
    plain = next((m for m, k in ap if k == '-'), None)
    if cali and plain and ap.get((cali, 'E_t')) is not None:
        e_t, base = ap[(cali, 'E_t')], ap[(plain, '-')]
        out.append(
            f'AP(E_t) of {cali} vs {plain}: {_pct(e_t)} vs {_pct(base)} '
            f'({100 * (e_t - base):+.1f}): **'
            f'{"at least" if e_t - base >= -0.005 else "below"} '
            f'AP({plain}) - 0.5**')
    for r in site_rows:
        if r['prior'] == 'E_site' and r['method'].startswith('Cali'):
            out.append(
                f'site {r["site"]} (epsilon {r["epsilon"]:.3f}): E_site vs '
                f'E_t {100 * r["gain_AP"]:+.1f} AP')
    for r in deployment_rows:
        if r['method'].startswith('Cali'):
            out.append(
                f'site {r["site"]}, {r["prior"]}: {r["gain"]:+.2f} AP '
                f'{r["interval"]} over {r["repeats"]} draws: **' +
                ('holds' if r['gain'] >= 0 and r['low'] >= -0.3 else 'fails') +
                '** (mean >= 0, interval >= -0.3)')
    for r in sweep_table(sweep_rows):
        if not r['method'].startswith('Cali'):
            continue
        helps = r.get('alpha 1', 0.0) > 0
        line = (f'sweep, site {r["site"]}: AP peaks at alpha {r["peak"]:g} '
                f'(alpha 1: {r.get("alpha 1", 0.0):+.2f}, alpha -1: '
                f'{r.get("alpha -1", 0.0):+.2f})')
        if helps:
            verdict = 'holds' if 0.5 <= r['peak'] <= 1.5 else 'fails'
            line += f': **{verdict}** (peak near 1 where E_site helps)'
        out.append(line)
    for r in selfcal_rows:
        radius = '' if r.get('radius') is None else \
            f' (trust radius {r["radius"]:g})'
        out.append(f'self-calibration{radius}, {r["method"]}, site '
                   f'{r["site"]}: '
                   f'{_pct(r["AP_start"])} -> {_pct(r["AP_end"])} AP '
                   f'({100 * r["gain"]:+.1f})')
    return out


def write_results(out_dir: str, results: Dict, trained: Dict, sched: Dict,
                  argv: Sequence[str], total: float) -> str:
    """Write ``results.md`` and ``results.json``.

    Args:
        out_dir (str): the results folder.
        results (dict): :func:`evaluate_all`'s result.
        trained (dict): :func:`train_both`'s result.
        sched (dict): the schedule as run (:func:`ran_schedule`).
        argv (Sequence[str]): the benchmark's command line.
        total (float): its seconds so far.

    Returns:
        str: the path of ``results.md``.
    """
    import torch

    from mmcalidet.evaluation import write_report
    t, secs = results['timings'], trained['seconds']
    machine = (f'{platform.machine()}, {os.cpu_count()} CPU cores, '
               f'torch threads {torch.get_num_threads()}, Python '
               f'{platform.python_version()}')
    cmd = ('python projects/context_shift/tools/benchmark.py ' +
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
         f'sites {t["sites"]:.0f} s, deployment '
         f'{t.get("deployment", 0):.0f} s, sweep {t.get("sweep", 0):.0f} '
         's, ' +
         (f'subsets {t["subsets"]:.0f} s, ' if 'subsets' in t else '') +
         f'self-calibration {t["self_calibration"]:.0f} s, online '
         f'{t.get("online", 0):.0f} s; {_mins(total)} '
         'in all (0 = reused).'),
        ('Claims', '\n'.join(f'- {c}' for c in results['claims'])),
        (f'Injected priors ({results["num_images"]} val images, all sites)',
         results['injection_md'] + '\n\n![](priors.png)'),
        ('Deployment sites: E_t vs the site prior',
         results['sites_md'] + '\n\n![](sites.png)')
    ]
    if results.get('deployment_md'):
        sections.append(
            ('Deployment: a site prior from a few labelled images, on the '
             'site\'s other images',
             results['deployment_md'] + '\n\nraw: the labelled images\' '
             'statistics; fitted: `fit_site_prior` on them (E_t + alpha '
             '(E_site - E_t), alpha by cross-validation, E_t when none '
             'gains). Gains over E_t on the other images of the site, mean '
             'of the draws, with a bootstrap interval over the draws.'))
    if results.get('sweep_md'):
        sections.append(
            ('Each site\'s prior swept: E_t + alpha (E_site - E_t)',
             results['sweep_md'] + '\n\n![](sweep.png)\n\nAP gain over E_t '
             '(alpha 0) on all the site\'s images; negative alpha reverses '
             'the site\'s shift.'))
    if results['subsets_md']:
        sections.append(('Subsets (E_b of each subset vs E_t)',
                         results['subsets_md'] + '\n\n![](subsets.png)'))
    sections.append(
        (f'Self-calibration per site (from E_t, {iters} iterations)',
         results['self_calibration_md'] + '\n\n![](self_calibration.png)'))
    if results.get('online'):
        sections.append(
            ('Online self-calibration per site (streamed from E_t)',
             results['online_md'] + '\n\nEach site\'s images arrive in '
             'batches of 16 in a fixed random order; each batch is '
             'predicted under the current E_c, then updates it. AP of the '
             'streamed predictions against E_t on the same images.'))
    data = {k: v for k, v in results.items() if not k.endswith('_md')}
    data.update(
        schedule=sched, training_seconds=secs, machine=machine, command=cmd)
    return write_report(out_dir, 'results', 'Context-shift benchmark results',
                        sections, data)[0]


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _decay(at: Optional[int], unit: str = '') -> str:
    """'lr x0.1 at [<unit> ]<at>', or 'a constant lr' (``at`` None)."""
    if at is None:
        return 'a constant lr'
    return f'lr x0.1 at {unit} {at}' if unit else f'lr x0.1 at {at}'


def _mins(s: float) -> str:
    return f'{s / 60:.1f} min' if s else 'reused'
