# Copyright (c) mmcalidet contributors. All rights reserved.
"""The mechanism table of a relation term: per training mode, the
predictive value of (prior, what the image shows) pairs
(:mod:`projects.context_shift.context_shift.evidence_signal`), measured
with a trained plain DINO's scores on the train images and on the folder's
val sites (split-half: each half's images with the other half's
statistics; and in-sample, the site's statistics with its own images).
Run from the repository root::

    export PYTHONPATH=$PWD:$PYTHONPATH
    python projects/context_shift/tools/evidence_signal.py \\
        work_dirs/cs_val/support/dino/dino_tiny_context-shift.py \\
        work_dirs/cs_val/support/dino/iter_600.pth \\
        --data data/cs_validation --out outputs/evidence_signal.md
"""
import argparse
import os
import os.path as osp
import platform
import sys
import time

import numpy as np

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mmcalidet.utils.cli import run_tool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Predictive value of (prior, evidence) pairs per mode')
    parser.add_argument('config', help='the plain DINO\'s config')
    parser.add_argument('checkpoint', help='its checkpoint')
    parser.add_argument('--data', required=True, help='the data folder')
    parser.add_argument(
        '--cache-dir',
        help='keep the decoder caches here (reused by a later run of this '
        'tool or of the other measurement tool on the same checkpoint)')
    parser.add_argument('--out', required=True, help='the Markdown table')
    parser.add_argument(
        '--draws', type=int, default=256, help='pairs drawn per mode')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args(argv)


def scores_of(config: str,
              checkpoint: str,
              data: str,
              split_options: dict,
              cache_dir=None):
    """(best logits (N, K), best scores (N, K), label lists, groups of the
    val split or None) of a split, from the DINO's cached outputs."""
    import torch

    from mmcalidet.evaluation import EvalSetup
    from mmcalidet.utils.log_level import library_output_to
    with library_output_to(os.devnull):
        setup = EvalSetup(
            config,
            checkpoint,
            cfg_options=split_options,
            train_prior=osp.join(data, 'priors', 'E_t.json'),
            cache_dir=cache_dir,
            progress=False)
    rescorer = setup.methods[0].rescorer
    best, labels = [], setup.cache.gt_label_lists()
    with torch.no_grad():
        for start in range(0, len(setup.cache), 64):
            idx = np.arange(start, min(start + 64, len(setup.cache)))
            hidden, _, _ = setup.cache.get(idx, rescorer.device)
            best.append(rescorer.logits(hidden, None).amax(1).cpu().numpy())
    best = np.concatenate(best).astype(np.float64)
    return best, 1 / (1 + np.exp(-best)), labels, setup


def training_pairs(labels, num_classes: int, draws: int,
                   rng: np.random.Generator) -> dict:
    """The EdgeSampler's modes as (prior, image indices) pairs on the
    train images (as tools/prior_signal.py draws them)."""
    from mmcalidet.priors import batch_prior, sample_prior
    from projects.context_shift.context_shift.simulated_sites import \
        SimulatedSites
    from projects.context_shift.tools.prior_signal import add_noise
    num = len(labels)
    e_t = batch_prior(num_classes, labels)
    modes = {}
    picked = rng.integers(num, size=draws)
    modes['E_x, its image'] = [(sample_prior(num_classes, labels[k]), [k])
                               for k in picked]
    for n in (4, 32, 256):
        batches = [
            rng.choice(num, size=n, replace=False) for _ in range(draws)
        ]
        modes[f'E_b({n}), its batch'] = [(batch_prior(num_classes,
                                                      [labels[k]
                                                       for k in b]), b)
                                         for b in batches]
    noisy = add_noise(np.repeat(e_t[None], draws, 0), 0.16, rng)
    modes['E_t + noise, a batch of 4'] = [
        (p, rng.choice(num, size=4, replace=False)) for p in noisy
    ]
    sites = SimulatedSites(
        labels,
        num_classes,
        kinds=('tilt', 'pairs'),
        min_images=1,
        tilt_fraction=0.15,
        pair_strength=16.0)
    tilted = [('tilt', int(s)) for s in rng.integers(2**31, size=draws)]
    modes['tilted site, a random batch of 4 (sim_site)'] = [
        (sites.statistics(key), rng.choice(num, size=4, replace=False))
        for key in tilted
    ]
    modes['tilted site, 4 of its images (site batches)'] = [
        (sites.statistics(key),
         rng.choice(sites.members(key), size=4, replace=False))
        for key in tilted
    ]
    if len(sites.seen_pairs):
        paired = [('pairs', int(s)) for s in rng.integers(2**31, size=draws)]
        modes['pair-tilted site, 4 of its images (site batches)'] = [
            (sites.statistics(key),
             rng.choice(sites.members(key), size=4, replace=False))
            for key in paired
        ]
    return e_t, modes


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault('MMCALIDET_CS_DATA', osp.abspath(args.data))
    from mmcalidet.evaluation import markdown_table, read_image_groups
    from mmcalidet.evaluation.partitions import group_partitions
    from mmcalidet.evaluation.split_half import site_halves
    from mmcalidet.priors import batch_prior
    from projects.context_shift.context_shift.evidence_signal import (
        fit_presence, mode_value)
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    root = osp.abspath(args.data)
    train = dict({
        'test_dataloader.dataset.ann_file':
        'annotations/instances_train.json',
        'test_evaluator.ann_file':
        osp.join(root, 'annotations', 'instances_train.json')
    })
    print('scoring the train images ...', flush=True)
    best, evidence, labels, setup = scores_of(args.config, args.checkpoint,
                                              args.data, train, args.cache_dir)
    k = best.shape[1]
    present = np.zeros_like(best, dtype=bool)
    for i, lab in enumerate(labels):
        present[i, np.asarray(lab, dtype=np.int64)] = True
    fit = fit_presence(best, present)
    e_t, modes = training_pairs(labels, k, args.draws, rng)
    rows = [
        dict(
            mode=name, **mode_value(pairs, best, evidence, present, e_t, fit))
        for name, pairs in modes.items()
    ]
    print('scoring the val sites ...', flush=True)
    v_best, v_evidence, v_labels, v_setup = scores_of(args.config,
                                                      args.checkpoint,
                                                      args.data, {},
                                                      args.cache_dir)
    v_present = np.zeros_like(v_best, dtype=bool)
    for i, lab in enumerate(v_labels):
        v_present[i, np.asarray(lab, dtype=np.int64)] = True
    groups = read_image_groups(
        osp.join(args.data, 'annotations', 'instances_val.json'),
        v_setup.cache.img_ids())
    v_fit = fit_presence(v_best, v_present)
    for site, idx in group_partitions(groups).items():
        # split-half: each half's images, in batches of 4, with the other
        # half's statistics; in-sample: with the site's own
        halves = site_halves(v_labels, idx, k)
        pairs = [(halves.priors[1 - h], part[i:i + 4])
                 for h, part in enumerate(halves.halves)
                 for i in range(0, len(part), 4)]
        rows.append(
            dict(
                mode=f'val site {site}, split-half',
                **mode_value(pairs, v_best, v_evidence, v_present, e_t,
                             v_fit)))
        prior = batch_prior(k, [v_labels[i] for i in idx])
        pairs = [(prior, idx[i:i + 4]) for i in range(0, len(idx), 4)]
        rows.append(
            dict(
                mode=f'val site {site}, its images (in-sample)',
                **mode_value(pairs, v_best, v_evidence, v_present, e_t,
                             v_fit)))
    table = markdown_table(
        rows, [('mode', 'mode (prior, the images it calibrates)', ''),
               ('pairs', 'pairs', ''), ('beta', 'fitted beta', '.1f'),
               ('value', 'predictive value (millinats per image and '
                'class)', '+.1f')])
    command = 'python projects/context_shift/tools/evidence_signal.py ' + \
        ' '.join(sys.argv[1:] if argv is None else argv)
    header = (f'{time.strftime("%Y-%m-%d")}, {platform.machine()} '
              f'({os.cpu_count()} cores), `{command}` '
              f'({time.perf_counter() - start:.0f} s)')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        f.write(f'{header}\n\n{table}\n')
    print(table)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    run_tool(main)
