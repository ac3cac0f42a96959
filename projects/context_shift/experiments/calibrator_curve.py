# Copyright (c) mmcalidet contributors. All rights reserved.
"""How a calibrator's prior response grows with its number of updates.

Trains a calibrator config (cached decoder outputs of a trained DINO, see
``configs/calidet_dino_tiny_context-shift_cached.py``) once,
at a constant learning rate, keeping a snapshot after each of ``--updates``
CaliFormer updates, then evaluates every snapshot on the DINO's validation
decoder outputs (the trunk is shared, so one cache serves all): the
injection table (flip(E_x), E0, E_t, E_b, E_x), its spread, the E0 -> E_x
gain against the DINO with the oracle marginal re-weighting, the flip(E_x)
drop, AP(E_t) against the DINO, and ``prior_sensitivity`` readings.

    export PYTHONPATH=$PWD:$PYTHONPATH  # from the repository root
    C=projects/context_shift/configs
    python projects/context_shift/experiments/calibrator_curve.py \
        $C/calidet_dino_tiny_context-shift_cached.py \
        --dino-config $C/dino_tiny_context-shift.py \
        --dino-checkpoint work_dirs/context_shift/dino/iter_3000.pth \
        --updates 1000 3000 10000 30000 --work-dir work_dirs/curve/default

Writes ``curve.md``, ``curve.json`` and ``curve.png`` to ``--out-dir``
(default ``<work-dir>/results``). A finished training (every snapshot
there, trained with the same settings: the benchmark's reuse rule,
:class:`Training`) is reused unless ``--retrain``.
"""
import argparse
import json
import os
import os.path as osp
import sys
from typing import Dict, Sequence

try:
    from projects.context_shift.context_shift import Training
except ImportError as exc:  # not run from the root with it on PYTHONPATH
    sys.exit(f'calibrator_curve.py: error: {exc}; run it from the '
             'repository root with export PYTHONPATH=$PWD:$PYTHONPATH')
from mmcalidet.utils.cli import run_tool

PRIORS = ('flip_E_x', 'E0', 'E_t', 'E_b', 'E_x')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Prior response of a calibrator against its number of '
        'updates (cached decoder outputs)')
    parser.add_argument('config', help='the calibrator config')
    parser.add_argument(
        '--dino-config', required=True, help='the trained DINO\'s config')
    parser.add_argument(
        '--dino-checkpoint', required=True, help='the trained DINO')
    parser.add_argument(
        '--updates',
        type=int,
        nargs='+',
        required=True,
        help='evaluate after these numbers of updates')
    parser.add_argument('--work-dir', required=True, help='training folder')
    parser.add_argument('--out-dir', help='default <work-dir>/results')
    parser.add_argument(
        '--cache-dir',
        help='the training-set decoder cache (default beside the DINO '
        'checkpoint: <its folder>/decoder_cache_train)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='overrides of the calibrator config (e.g. the recipe)')
    parser.add_argument(
        '--max-images', type=int, help='evaluate the first N val images')
    parser.add_argument(
        '--retrain', action='store_true', help='train even if done')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bars')
    return parser.parse_args(argv)


def write_config(args: argparse.Namespace, updates: Sequence[int]) -> str:
    """Train (or reuse) the calibrator config at a constant lr for
    ``max(updates)`` updates, with snapshots and no validation.

    Args:
        args (argparse.Namespace): the tool's arguments.
        updates (Sequence[int]): the snapshots to keep.

    Returns:
        str: the generated training config.
    """
    last = max(updates)
    cache_dir = args.cache_dir or osp.join(
        osp.dirname(osp.abspath(args.dino_checkpoint)), 'decoder_cache_train')
    text = '\n'.join([
        '# written by projects/context_shift/experiments/calibrator_curve.py',
        f'_base_ = {osp.abspath(args.config)!r}',
        f'load_from = {osp.abspath(args.dino_checkpoint)!r}',
        'train_dataloader = dict(dataset=dict(',
        f'    cache_dir={osp.abspath(cache_dir)!r},',
        f'    source=dict(config={osp.abspath(args.dino_config)!r},',
        f'                checkpoint={osp.abspath(args.dino_checkpoint)!r})))',
        f'train_cfg = dict(max_iters={last}, val_begin={last + 1}, '
        f'val_interval={last + 1})',
        'param_scheduler = []  # a constant learning rate',
        f'default_hooks = dict(checkpoint=dict(interval={last}))',
        "custom_hooks = [dict(type='IterationSeedHook'),",
        "                dict(type='PriorClassesHook'),",
        f"                dict(type='SnapshotHook', iters={list(updates)})]",
        ''
    ])
    # outside the work folder, where mmengine dumps the resolved config
    os.makedirs(osp.join(args.work_dir, 'generated'), exist_ok=True)
    path = osp.join(args.work_dir, 'generated', 'curve_config.py')
    with open(path, 'w') as f:
        f.write(text)
    missing = not all(osp.isfile(snapshot(args.work_dir, n)) for n in updates)
    Training(
        path,
        args.work_dir,
        last,
        list(args.cfg_options),
        args.retrain or missing,
        os.environ.get('MMCALIDET_CS_DATA', 'data/context_shift'),
        progress=not args.no_progress).wait()
    return path


def snapshot(work_dir: str, updates: int) -> str:
    return osp.join(work_dir, f'snapshot_iter_{updates}.pth')


def summarize(rows: Sequence[Dict], dino_ap: float, order: Dict) -> Dict:
    """The response figures of one injection table (AP in points).

    Args:
        rows (Sequence[dict]): the injection table's rows of one method.
        dino_ap (float): the DINO's AP (in [0, 1]).
        order (dict): the table's expected-order verdict over ``PRIORS``
            (:func:`mmcalidet.evaluation.protocol.injection`'s
            ``orders``, or :func:`~mmcalidet.evaluation.protocol.
            expected_orders` of the rows).

    Returns:
        dict: ``AP_<prior>``, ``spread`` (E_x - flip), ``gain`` (E_x - E0),
        ``flip_drop`` (E0 - flip), ``et_vs_dino`` and ``order`` (the
        library's verdict on the expected order).
    """
    v = {r['key']: 100 * r['AP'] for r in rows}
    return dict(
        **{f'AP_{k}': v[k]
           for k in PRIORS},
        spread=v['E_x'] - v['flip_E_x'],
        gain=v['E_x'] - v['E0'],
        flip_drop=v['E0'] - v['flip_E_x'],
        et_vs_dino=v['E_t'] - 100 * dino_ap,
        order=order['verdict'])


def evaluate(args: argparse.Namespace, config: str,
             updates: Sequence[int]) -> Dict:
    """Every snapshot's injection table on the DINO's val decoder cache
    (:class:`EvalSetup` of the DINO with the marginal re-weighting; each
    snapshot re-scores its cache)."""
    from mmengine.config import DictAction

    from mmcalidet.evaluation import (EvalSetup, Method, Rescorer,
                                      cache_evaluator, prior_sensitivity,
                                      protocol)
    from mmcalidet.evaluation.methods import build_detector, load_config
    from mmcalidet.utils.log_level import quiet_mmengine
    opts = argparse.Namespace()
    DictAction([], 'cfg')(None, opts, list(args.cfg_options))
    quiet_mmengine()
    progress = not args.no_progress
    ccfg = load_config(config, opts.cfg, args.max_images)
    setup = EvalSetup(
        args.dino_config,
        args.dino_checkpoint,
        posthoc=['reweight'],
        train_prior=ccfg.get('prior') or ccfg.model.get('prior'),
        max_images=args.max_images,
        progress=progress)
    cache, score = setup.cache, cache_evaluator(setup.evaluator)
    e_t = setup.train_prior
    labels = cache.gt_label_lists()

    def injection(methods):
        return protocol.injection(
            methods,
            score,
            e_t,
            PRIORS,
            classes=setup.classes,
            orders=dict(orders=PRIORS),
            progress=progress)

    base_rows = injection(setup.methods).rows
    dino_ap = base_rows[0]['AP']
    rw = {r['key']: 100 * r['AP'] for r in base_rows[1:]}
    reference = dict(
        AP_dino=100 * dino_ap,
        reweight_gain=rw['E_x'] - 100 * dino_ap,
        reweight=rw)
    points = []
    for n in updates:
        model = build_detector(ccfg, snapshot(args.work_dir, n))
        table = injection([Method('CaliDINO', Rescorer(model, cache))])
        sens = {
            r['prior']: r
            for r in prior_sensitivity(model.bbox_head, labels, e_t)
        }
        point = dict(
            updates=n,
            **summarize(table.rows, dino_ap,
                        table.extras['orders']['CaliDINO']))
        point.update(
            change_E_x=100 * sens['E_x']['relative_change'],
            present_E_x=sens['E_x']['present_shift'],
            present_flip=sens['flip_E_x']['present_shift'])
        points.append(point)
        print(f'[eval] {n} updates: spread {point["spread"]:+.2f}, '
              f'E0 -> E_x {point["gain"]:+.2f}, AP(E_t) '
              f'{point["AP_E_t"]:.2f}', flush=True)
    return dict(reference=reference, points=points, num_images=len(cache))


def plot(result: Dict, path: str, title: str) -> str:
    """Four panels against the number of updates (log scale)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    pts = result['points']
    ref = result['reference']
    x = [p['updates'] for p in pts]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [
        ('spread', 'AP(E_x) - AP(flip E_x)', None, None),
        ('gain', 'AP(E_x) - AP(E0)', ref['reweight_gain'],
         'DINO + re-weighting, E_x'),
        ('flip_drop', 'AP(E0) - AP(flip E_x)', 2.0, 'target 2 AP'),
        ('AP_E_t', 'AP(E_t)', ref['AP_dino'], 'DINO'),
    ]
    for ax, (key, label, line, line_label) in zip(axes, panels):
        ax.plot(x, [p[key] for p in pts], 'o-', color='tab:blue')
        if line is not None:
            ax.axhline(line, color='tab:red', ls='--', label=line_label)
            ax.legend(fontsize=8)
        if key == 'AP_E_t':
            ax.axhline(
                ref['AP_dino'] - 0.5, color='tab:red', ls=':', lw=0.8)
        ax.set_xscale('log')
        ax.set_xlabel('CaliFormer updates')
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(result: Dict, title: str, command: str) -> str:
    from mmcalidet.evaluation.report import markdown_table
    ref = result['reference']
    cols = [('updates', 'updates', '')] + [
        (f'AP_{k}', f'AP({k})', '.2f') for k in PRIORS
    ] + [('spread', 'spread', '+.2f'), ('gain', 'E0->E_x', '+.2f'),
         ('flip_drop', 'flip drop', '+.2f'),
         ('et_vs_dino', 'E_t - DINO', '+.2f'), ('order', 'order', ''),
         ('change_E_x', 'V\' change E_x %', '.1f'),
         ('present_E_x', 'shift E_x', '+.3f'),
         ('present_flip', 'shift flip', '+.3f')]
    rows = result['points']
    return '\n'.join([
        f'# {title}', '', f'Command: `{command}`', '',
        f'{result["num_images"]} val images. DINO AP {ref["AP_dino"]:.2f}; '
        'DINO + oracle marginal re-weighting with E_x: '
        f'{ref["reweight"]["E_x"]:.2f} ({ref["reweight_gain"]:+.2f}).', '',
        markdown_table(rows, cols), '', '![](curve.png)', ''
    ])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    updates = sorted(set(args.updates))
    if updates[0] < 1:
        raise ValueError('--updates must be >= 1')
    for path in (args.config, args.dino_config, args.dino_checkpoint):
        if not osp.isfile(path):
            raise ValueError(f'not found: {path}')
    config = write_config(args, updates)
    out_dir = args.out_dir or osp.join(args.work_dir, 'results')
    os.makedirs(out_dir, exist_ok=True)
    result = evaluate(args, config, updates)
    title = (f'Prior response against CaliFormer updates: '
             f'{osp.basename(args.config)} '
             f'{" ".join(args.cfg_options)}').strip()
    command = ('python projects/context_shift/experiments/'
               'calibrator_curve.py ' + ' '.join(argv))
    from mmcalidet.utils.file_io import atomic_write
    with atomic_write(osp.join(out_dir, 'curve.md')) as f:
        f.write(markdown(result, title, command))
    with atomic_write(osp.join(out_dir, 'curve.json')) as f:
        json.dump(dict(result, command=command), f, indent=1)
    plot(result, osp.join(out_dir, 'curve.png'), title)
    print(open(osp.join(out_dir, 'curve.md')).read())
    return 0


if __name__ == '__main__':
    run_tool(main)
