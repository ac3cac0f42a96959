# Copyright (c) mmcalidet contributors. All rights reserved.
"""How a calibrator's prior response grows with its number of updates.

Trains a calibrator config (cached decoder outputs of a trained DINO, see
``configs/context_shift/calidet_dino_tiny_context-shift_cached.py``) once,
at a constant learning rate, keeping a snapshot after each of ``--updates``
CaliFormer updates, then evaluates every snapshot on the DINO's validation
decoder outputs (the trunk is shared, so one cache serves all): the
injection table (flip(E_x), E0, E_t, E_b, E_x), its spread, the E0 -> E_x
gain against the DINO with the oracle marginal re-weighting, the flip(E_x)
drop, AP(E_t) against the DINO, and ``prior_sensitivity`` readings.

    python tools/analysis_tools/calibrator_curve.py \
        configs/context_shift/calidet_dino_tiny_context-shift_cached.py \
        --dino-config configs/context_shift/dino_tiny_context-shift.py \
        --dino-checkpoint work_dirs/context_shift/dino/iter_3000.pth \
        --updates 1000 3000 10000 30000 --work-dir work_dirs/curve/default

Writes ``curve.md``, ``curve.json`` and ``curve.png`` to ``--out-dir``
(default ``<work-dir>/results``). A finished training (every snapshot there,
the same generated config) is reused unless ``--retrain``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import Dict, Optional, Sequence

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmcalidet.utils.cli import run_tool  # noqa: E402

PRIORS = ('flip_E_x', 'E0', 'E_t', 'E_b', 'E_x')


def _read(path: str) -> Optional[str]:
    """The text of ``path``, or None where there is no such file."""
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return f.read()


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
    """The training config: the calibrator config at a constant lr for
    ``max(updates)`` updates, with snapshots and no validation."""
    last = max(updates)
    cache_dir = args.cache_dir or osp.join(
        osp.dirname(osp.abspath(args.dino_checkpoint)), 'decoder_cache_train')
    text = '\n'.join([
        '# written by tools/analysis_tools/calibrator_curve.py',
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
        f"                dict(type='SnapshotHook', iters={list(updates)})]",
        ''
    ])
    # outside the work folder, where mmengine dumps the resolved config
    os.makedirs(osp.join(args.work_dir, 'generated'), exist_ok=True)
    path = osp.join(args.work_dir, 'generated', 'curve_config.py')
    options = osp.join(args.work_dir, 'generated', 'curve_options.json')
    same = _read(path) == text and osp.isfile(options) and json.loads(
        _read(options)) == args.cfg_options
    done = same and all(
        osp.isfile(snapshot(args.work_dir, n)) for n in updates)
    if done and not args.retrain:
        print(f'[train] reusing the snapshots in {args.work_dir}')
        return path
    with open(path, 'w') as f:
        f.write(text)
    with open(options, 'w') as f:
        json.dump(args.cfg_options, f)
    cmd = [
        sys.executable,
        osp.join(ROOT, 'tools', 'train.py'), path, '--work-dir',
        args.work_dir
    ]
    if args.cfg_options:
        cmd += ['--cfg-options'] + list(args.cfg_options)
    print('[train] ' + ' '.join(cmd[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    print(f'[train] {last} updates in {time.perf_counter() - start:.0f} s')
    return path


def snapshot(work_dir: str, updates: int) -> str:
    return osp.join(work_dir, f'snapshot_iter_{updates}.pth')


def summarize(ap: Dict[str, float], dino_ap: float) -> Dict:
    """The response figures of one injection table (AP in points)."""
    v = {k: 100 * ap[k] for k in PRIORS}
    return dict(
        **{f'AP_{k}': v[k]
           for k in PRIORS},
        spread=v['E_x'] - v['flip_E_x'],
        gain=v['E_x'] - v['E0'],
        flip_drop=v['E0'] - v['flip_E_x'],
        et_vs_dino=v['E_t'] - 100 * dino_ap,
        order=bool(v['flip_E_x'] < v['E0'] <= v['E_t'] <= v['E_b'] <
                   v['E_x']))


def evaluate(args: argparse.Namespace, config: str,
             updates: Sequence[int]) -> Dict:
    """Every snapshot's injection table on the DINO's val decoder cache."""
    from mmcalidet.evaluation import (build_priors, cache_evaluator,
                                      evaluate_priors)
    from mmcalidet.evaluation.baselines import (build_correction,
                                                class_frequencies)
    from mmcalidet.evaluation.cache import cache_hidden_states
    from mmcalidet.evaluation.coco import coco_evaluator_from_cfg
    from mmcalidet.evaluation.scoring import Rescorer
    from mmcalidet.evaluation.sensitivity import prior_sensitivity
    from mmcalidet.evaluation.sweep import Method
    from mmcalidet.evaluation.methods import (build_detector,
                                              build_test_loader, load_config,
                                              resolve_train_prior)
    from mmcalidet.utils.log_level import quiet_mmengine
    from mmengine.config import DictAction
    opts = argparse.Namespace()
    DictAction([], 'cfg')(None, opts, list(args.cfg_options))
    quiet_mmengine()
    progress = not args.no_progress
    dcfg = load_config(args.dino_config, max_images=args.max_images)
    loader = build_test_loader(dcfg)
    classes = list(loader.dataset.metainfo['classes'])
    dino = build_detector(dcfg, args.dino_checkpoint)
    cache = cache_hidden_states(dino, loader, progress=progress)
    score = cache_evaluator(coco_evaluator_from_cfg(dcfg, classes))
    ccfg = load_config(config, opts.cfg, args.max_images)
    e_t, meta = resolve_train_prior(None, None, ccfg, classes)
    labels = cache.gt_label_lists()
    specs = build_priors(PRIORS, labels, e_t, cache.batch_ids, None, classes)
    reweight = build_correction('reweight', e_t,
                                class_frequencies(meta, classes))
    base_rows = evaluate_priors([
        Method('DINO', Rescorer(dino, cache)),
        Method('DINO + marginal re-weighting',
               Rescorer(dino, cache, reweight))
    ], specs, score, progress)
    dino_ap = base_rows[0]['AP']
    rw = {r['key']: 100 * r['AP'] for r in base_rows[1:]}
    reference = dict(
        AP_dino=100 * dino_ap,
        reweight_gain=rw['E_x'] - 100 * dino_ap,
        reweight=rw)
    points = []
    for n in updates:
        model = build_detector(ccfg, snapshot(args.work_dir, n))
        rows = evaluate_priors([Method('CaliDINO', Rescorer(model, cache))],
                               specs, score, progress)
        sens = {
            r['prior']: r
            for r in prior_sensitivity(model.bbox_head, labels, e_t)
        }
        point = dict(
            updates=n, **summarize({r['key']: r['AP']
                                    for r in rows}, dino_ap))
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
    rows = [dict(p, order='holds' if p['order'] else 'no')
            for p in result['points']]
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
    command = 'python tools/analysis_tools/calibrator_curve.py ' + \
        ' '.join(argv)
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
