# Copyright (c) mmcalidet contributors. All rights reserved.
"""The benchmark's evaluation: every table, plot and claim from the trained
DINO and CaliDINO, each table one call of
:mod:`mmcalidet.evaluation.protocol` on the
:class:`~mmcalidet.evaluation.EvalSetup` of both."""
import os
import os.path as osp
import platform
import time
from typing import Dict, List, Optional, Sequence, Union

from mmcalidet.calibration import DEFAULT_TRUST_RADIUS
from mmcalidet.evaluation.report import fmt_interval, sweep_table
from mmcalidet.evaluation.split_half import SPLIT_HALF
from .training import trained_config

#: the deployment sites, in table order
SITES = ('like_train', 'left_only', 'crossed', 'swapped')

#: how the site rows were measured (results.md)
SITE_NOTE = (
    'E_site: each site split by image parity into two halves, each half '
    'scored under the other half\'s statistics (with their support), each '
    'its own AP, the halves\' gains averaged; E_site(in-sample): scored on '
    'the images it was measured on (the paper\'s subset protocol). 90 % '
    'intervals: paired bootstrap over images (within each half).')
#: the relation-only figure (results.md)
RELATION_NOTE = (
    'Relation-only: the AP over the classes whose share of the site\'s '
    'images lies within 25 % of their share in training (split-half).')

#: what each detector's calibrator learns from (results.md)
CACHED_OUTPUTS = {
    'dino': 'decoder outputs',
    'rtmdet': 'dense locations (classification features)',
    'faster-rcnn': 'sampled RoIs (box classifier inputs)',
}


def _pct(v: Optional[float]) -> str:
    if v is None or v != v:
        return '-'
    return f'{100 * v:.1f}'


class _Context:
    """What every table of :func:`evaluate_all` reads: the methods over
    one decoder cache per detector, E_t, the evaluator and the sites.

    Args:
        setup (EvalSetup): the detectors and their caches.
        data (str): the benchmark data folder (its sites).
    """

    def __init__(self, setup, data: str) -> None:
        from mmcalidet.evaluation import (SWEEP_ALPHAS, cache_evaluator,
                                          prior_support, read_image_groups,
                                          site_priors)
        from mmcalidet.evaluation.partitions import group_partitions
        self.setup, self.methods = setup, setup.methods
        self.e_t, self.evaluator = setup.train_prior, setup.evaluator
        self.evaluate = cache_evaluator(setup.evaluator)
        cache = setup.cache
        labels = cache.gt_label_lists()
        self.groups = read_image_groups(
            osp.join(data, 'annotations', 'instances_val.json'),
            cache.img_ids())
        order = [s for s in SITES if s in set(self.groups)
                 ] + sorted(set(self.groups) - set(SITES))
        self.site_prior = site_priors(labels, self.groups, len(self.e_t),
                                      order)
        self.sites = group_partitions(self.groups, order)
        # training's class shares (the relation-only gains), when E_t
        # records them
        train = setup.train
        self.train_shares = train.marginals if train is not None and \
            train.has_support else None
        # a CaliFormer that reads a prior's support (experimental) is told
        # what each label-built prior was measured on; no-op otherwise
        for m in self.methods:
            prior_support.register_label_supports(
                m.rescorer,
                labels,
                setup.train,
                cache.batch_ids,
                sites={
                    s: (self.site_prior[s], self.sites[s])
                    for s in self.sites
                },
                sweep_alphas=SWEEP_ALPHAS)

    def remember(self, keep: bool = True) -> None:
        """Score and evaluate each (prior, image set) the tables share
        once (E_t and E_site of a site: the site table, the deployment
        rows' baseline, the sweep's alpha 0 and 1, the online rows'
        start); ``keep=False`` forgets them."""
        self.evaluator.remember(keep)
        for m in self.methods:
            m.rescorer.remember(keep)


def _eval_setup(trained: Dict, posthoc: Sequence[str], progress: bool,
                log_file: Optional[str]):
    """The :class:`~mmcalidet.evaluation.EvalSetup` of the trained DINO
    and CaliDINO (one decoder cache each, or one for both)."""
    import torch

    from mmcalidet.evaluation import EvalSetup
    from mmcalidet.utils.log_level import library_output_to

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
            posthoc=posthoc,
            device='cuda' if torch.cuda.is_available() else 'cpu',
            progress=progress)
    if setup.info.get('shared_cache'):
        plain, cali = trained.get('names', ('DINO', 'CaliDINO'))
        kind = 'decoder' if trained.get('detector', 'dino') == 'dino' \
            else 'feature'
        print(
            f'[eval] the {cali} keeps the {plain}\'s trunk: one {kind} '
            'cache serves both',
            flush=True)
    return setup


def _timed(timings: Dict, key: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its seconds in ``timings[key]``."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    timings[key] = time.perf_counter() - start
    return out


def _tables(ctx: _Context, timings: Dict, *, quick: bool, progress: bool,
            fit_labelled, fit_repeats: int, fit_accept: str,
            self_cal_iters: int, score_thr: float, self_cal_radius,
            online_radius, resamples: int) -> Dict:
    """Every table of the benchmark, each one call of
    :mod:`mmcalidet.evaluation.protocol` (the arguments: see
    :func:`evaluate_all`)."""
    from mmcalidet.evaluation import (CONTENT_PRIORS, STANDARD_PRIORS,
                                      SUBSET_SIZES)
    from mmcalidet.evaluation import protocol as P
    methods, e_t, parts = ctx.methods, ctx.e_t, ctx.sites
    tables = {}
    # the paper's priors, then E_x and flip(E_x) without their presence
    # pattern (does the detector read the relations themselves?)
    tables['injection'] = _timed(
        timings,
        'injection',
        P.injection,
        methods,
        ctx.evaluate,
        e_t,
        STANDARD_PRIORS + ('filled_flip_E_x', 'filled_E_x'),
        classes=ctx.setup.classes,
        progress=progress,
        orders=dict(orders=STANDARD_PRIORS, content_orders=CONTENT_PRIORS))
    tables['sites'] = _timed(timings, 'sites', P.sites, methods, ctx.evaluator,
                             e_t, parts, ctx.site_prior, ctx.train_shares,
                             resamples=resamples)
    tables['deployment'] = _timed(timings, 'deployment', P.deployment, methods,
                                  ctx.evaluator, e_t, parts, fit_labelled,
                                  fit_repeats, fit_accept, progress)
    tables['sweep'] = _timed(timings, 'sweep', P.sweep, methods, ctx.evaluator,
                             e_t, parts, ctx.site_prior,
                             resamples=max(1, resamples // 5))
    tables['subsets'] = P.ProtocolTable([], '') if quick else _timed(
        timings,
        'subsets',
        P.subsets,
        methods,
        ctx.evaluate,
        e_t,
        SUBSET_SIZES,
        progress=progress)
    tables['self_calibration'] = _timed(
        timings,
        'self_calibration',
        P.self_calibration,
        methods,
        ctx.evaluate,
        e_t,
        parts,
        ctx.site_prior,
        iters=self_cal_iters,
        score_thr=score_thr,
        tol=0,
        radii=self_cal_radius or [DEFAULT_TRUST_RADIUS],
        batch_size=ctx.setup.rescore_batch_size)
    tables['online'] = _timed(timings, 'online', P.online, methods,
                              ctx.evaluate, e_t, parts, ctx.site_prior,
                              online_radius, score_thr)
    return tables


def _plots(ctx: _Context, results: Dict, out_dir: str) -> List[str]:
    """The benchmark's plots (priors, sites, sweep, self-calibration,
    subsets, each site's prior against E_t)."""
    from mmcalidet.visualization import (plot_prior_comparison,
                                         plot_prior_sweep,
                                         plot_self_calibration,
                                         plot_shrinkage_sweep,
                                         plot_site_results,
                                         plot_subset_results)
    plots = [
        plot_prior_sweep(results['injection'], osp.join(out_dir,
                                                        'priors.png')),
        plot_site_results(results['sites'], osp.join(out_dir, 'sites.png')),
        plot_shrinkage_sweep(
            [r for r in results['sweep'] if r['prior'] == SPLIT_HALF],
            osp.join(out_dir, 'sweep.png'),
            title='AP gain over E_t along E_t + alpha (E_site - E_t), '
            'split-half'),
        plot_self_calibration(
            results['curves'],
            osp.join(out_dir, 'self_calibration.png'),
            title='Self-calibration per site (from E_t)'),
    ]
    if results['subsets']:
        plots.append(
            plot_subset_results(results['subsets'],
                                osp.join(out_dir, 'subsets.png')))
    for site in ctx.sites:
        plots.append(
            plot_prior_comparison(
                ctx.e_t,
                ctx.site_prior[site],
                osp.join(out_dir, f'prior_{site}.png'),
                names=('E_t', f'E_{site}'),
                classes=ctx.setup.classes))
    return plots


def _results(tables: Dict) -> Dict:
    """The tables' rows and Markdown under the keys of
    :func:`evaluate_all`'s result, with the claims."""
    injection = tables['injection'].extras
    results = dict(
        injection=tables['injection'].rows,
        injection_md=tables['injection'].markdown,
        orders=injection['orders'])
    for key in ('sites', 'deployment', 'sweep', 'subsets', 'self_calibration',
                'online'):
        results.update({
            key: tables[key].rows,
            f'{key}_md': tables[key].markdown
        })
    results.update(
        site_means=tables['sites'].extras['means'],
        site_summary_md=tables['sites'].extras['summary_md'],
        curves=tables['self_calibration'].extras['curves'],
        content_orders=injection['content_orders'])
    results['claims'] = claims(results['injection'], results['sites'],
                               results['self_calibration'], results['orders'],
                               results['deployment'],
                               results['content_orders'], results['sweep'],
                               results['site_means'])
    return results


def evaluate_all(trained: Dict,
                 out_dir: str,
                 data_meta: Dict,
                 *,
                 data: str,
                 posthoc: Sequence[str] = ('reweight', 'cooccurrence'),
                 quick: bool = False,
                 fit_labelled: Union[int, Sequence[int]] = 32,
                 fit_repeats: int = 10,
                 fit_accept: str = 'interval',
                 self_cal_iters: int = 10,
                 score_thr: float = 0.3,
                 self_cal_radius: Optional[Sequence] = None,
                 online_radius: Optional[Sequence] = None,
                 progress: bool = True,
                 log_file: Optional[str] = None,
                 resamples: int = 1000) -> Dict:
    """Every table and plot of the benchmark, from one decoder cache per
    detector (all sites' val images), through
    :mod:`mmcalidet.evaluation.protocol`.

    Args:
        trained (dict): :func:`train_both`'s result.
        out_dir (str): where the plots go.
        data_meta (dict): the data folder's ``meta.json``.
        data (str): the benchmark data folder.
        posthoc (Sequence[str]): post-hoc corrections of the plain DINO.
        quick (bool): leave out the subset table.
        fit_labelled (int | Sequence[int]): deployment rows: labelled
            images per draw (a row each).
        fit_repeats (int): deployment rows: draws per site (0: none).
        fit_accept (str): deployment rows: when the fitted prior leaves
            E_t (see :func:`~mmcalidet.calibration.fit_site_prior`).
        self_cal_iters (int): self-calibration iterations per site.
        score_thr (float): self-calibration score threshold.
        self_cal_radius (Sequence, optional): self-calibration trust radii
            (``None`` items: no limit; default ``DEFAULT_TRUST_RADIUS``).
        online_radius (Sequence, optional): online trust radii (likewise).
        progress (bool): show progress bars.
        log_file (str, optional): where what the libraries print while
            the models load goes (default: nowhere).
        resamples (int): bootstrap resamples of the site table's
            intervals (the sweep's: a fifth of them).

    Returns:
        dict: the rows and markdown of every table, the self-calibration
        curves, the claims, the plots written and the timings.
    """
    os.environ['MMCALIDET_CS_DATA'] = osp.realpath(data)
    timings: Dict[str, float] = {}
    setup = _timed(timings, 'cache', _eval_setup, trained, posthoc, progress,
                   log_file)
    ctx = _Context(setup, data)
    ctx.remember()
    tables = _tables(
        ctx,
        timings,
        quick=quick,
        progress=progress,
        fit_labelled=fit_labelled,
        fit_repeats=fit_repeats,
        fit_accept=fit_accept,
        self_cal_iters=self_cal_iters,
        score_thr=score_thr,
        self_cal_radius=self_cal_radius,
        online_radius=[DEFAULT_TRUST_RADIUS]
        if online_radius is None else online_radius,
        resamples=resamples)
    ctx.remember(False)
    results = _results(tables)
    return dict(
        results,
        plots=_plots(ctx, results, out_dir),
        timings=timings,
        num_images=len(setup.cache),
        data_epsilon=data_meta.get('epsilon', {}))


def claims(prior_rows,
           site_rows,
           selfcal_rows,
           orders,
           deployment_rows=(),
           content_orders=None,
           sweep_rows=(),
           site_means=()) -> List[str]:
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
        site_means (list[dict]): the mean gain over sites per method and
            prior (G of the split-half rows).

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
        if r['prior'] == SPLIT_HALF and r['method'].startswith('Cali'):
            out.append(
                f'site {r["site"]} (epsilon {r["epsilon"]:.3f}): E_site '
                f'(split-half) vs E_t {100 * r["gain_AP"]:+.2f} AP '
                f'{fmt_interval(r.get("interval"))}')
    for m in site_means:
        if m['prior'] == SPLIT_HALF:
            out.append(f'G, {m["method"]} (mean over {len(m["sites"])} '
                       f'sites, split-half): {100 * m["gain_AP"]:+.2f} AP '
                       f'{fmt_interval(m["interval"])}')
    for r in deployment_rows:
        if r['method'].startswith('Cali'):
            out.append(
                f'site {r["site"]}, {r["prior"]}: {r["gain"]:+.2f} AP '
                f'{r["interval"]} over {r["repeats"]} draws: **' +
                ('holds' if r['gain'] >= 0 and r['low'] >= -0.3 else 'fails') +
                '** (mean >= 0, interval >= -0.3)')
    for r in sweep_table(sweep_rows):
        if not r['method'].startswith('Cali') or \
                r.get('prior', SPLIT_HALF) != SPLIT_HALF:
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


def _calibrator_schedule(sched: Dict, trained: Dict, plain: str,
                         cali: str) -> str:
    """The calibrated detector's schedule, in words (results.md).

    Args:
        sched (dict): the schedule as run (:func:`ran_schedule`).
        trained (dict): :func:`train_both`'s result.
        plain (str): the plain detector's name.
        cali (str): the calibrated detector's name.

    Returns:
        str: one sentence.
    """
    outputs = CACHED_OUTPUTS[trained.get('detector', 'dino')]
    if sched['init'] == 'scratch':
        return f'{cali} the same schedule from scratch.'
    if sched['init'] == 'cached':
        return (f'{cali}: {sched["calidet"]} CaliFormer updates on the '
                f'final {plain}\'s cached {outputs} ('
                f'{_decay(sched["calidet_decay"], "update")}; the trunk '
                f'stays the {plain}\'s).')
    return (f'{cali} {sched["calidet"]} iterations from the {plain}\'s '
            f'iteration {sched["start"]} '
            f'({_decay(sched["calidet_decay"], "its iteration")}).')


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
    plain, cali = trained.get('names', ('DINO', 'CaliDINO'))
    calidet = _calibrator_schedule(sched, trained, plain, cali)
    caches = 'decoder caches' if plain == 'DINO' else 'feature caches'
    iters = len(next(iter(results['curves'].values()))) - 1
    sections = [
        (None, f'Command: `{cmd}`'), (None, f'Machine: {machine}'),
        (None, f'Schedule: plain {plain} {sched["dino"]} iterations of 4 '
         f'images ({_decay(sched["decay"])}); ' + calidet),
        (None, f'Wall-clock: {plain} training {_mins(secs["dino"])}, {cali} '
         f'training {_mins(secs["calidet"])}, {caches} '
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
         results['sites_md'] + '\n\n![](sites.png)\n\n' + SITE_NOTE),
        ('Mean gain over the sites; relation-only gains',
         results['site_summary_md'] + '\n\n' + RELATION_NOTE)
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
             '(alpha 0) with its 90 % interval; E_site: split-half (each '
             'half under the other half\'s statistics), E_site(in-sample): '
             'on the images E_site was measured on; negative alpha reverses '
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
        schedule=sched,
        training_seconds=secs,
        machine=machine,
        command=cmd,
        detector=trained.get('detector', 'dino'),
        methods=dict(plain=plain, calidet=cali))
    title = 'Context-shift benchmark results' + ('' if plain == 'DINO' else
                                                 f' ({plain} and {cali})')
    return write_report(out_dir, 'results', title, sections, data)[0]


def _decay(at: Optional[int], unit: str = '') -> str:
    """'lr x0.1 at [<unit> ]<at>', or 'a constant lr' (``at`` None)."""
    if at is None:
        return 'a constant lr'
    return f'lr x0.1 at {unit} {at}' if unit else f'lr x0.1 at {at}'


def _mins(s: float) -> str:
    return f'{s / 60:.1f} min' if s else 'reused'
