# Copyright (c) mmcalidet contributors. All rights reserved.
"""The first-step loss of a CaliDINO built on a trained DINO, with the
paper's plain CaliFormer initialisation and with ``zero_init_output`` (V'
starts at 0), against the DINO's own loss on the same batches.

    python benchmarks/bench_calibrator_init.py \
        --dino-checkpoint work_dirs/context_shift_quick/dino/iter_900.pth \
        --cache work_dirs/context_shift_quick/dino/decoder_cache_train

Losses are those of the matching queries on cached decoder outputs (focal,
box and LoMa per decoder layer, as in calibrator training), under the
EdgeSampler's priors, averaged over ``--batches`` batches of 4, before any
update. ``V' = 0`` gives the DINO's classification loss exactly; the plain
initialisation starts where V' is of unit scale.
"""
import argparse
import copy
import os.path as osp
import sys

import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.dataset import pseudo_collate
from mmengine.runner import load_checkpoint

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mmcalidet.datasets import DecoderCacheDataset  # noqa: E402
from testing import get_config, match_config_classes  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--config',
        default='../projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift_cached.py')
    parser.add_argument('--dino-checkpoint', required=True)
    parser.add_argument('--cache', required=True)
    parser.add_argument('--batches', type=int, default=20)
    parser.add_argument('--seeds', type=int, default=3)
    return parser.parse_args()


def mean_losses(model, dataset, batches: int) -> dict:
    rng = np.random.default_rng(0)
    np.random.seed(0)
    sums = {}
    with torch.no_grad():
        for _ in range(batches):
            idx = rng.choice(len(dataset), size=4, replace=False)
            data = model.data_preprocessor(
                pseudo_collate([dataset[int(i)] for i in idx]), True)
            losses = model.loss(data['inputs'], data['data_samples'])
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + float(v)
    cls = sum(v for k, v in sums.items() if k.endswith('loss_cls'))
    loma = sum(v for k, v in sums.items() if k.endswith('loss_loma'))
    total = sum(sums.values())
    return dict(
        loss=total / batches,
        loss_cls=cls / batches,
        loss_loma=loma / batches)


def main() -> None:
    args = parse_args()
    register_all_modules()
    cfg = get_config(args.config)
    dataset = DecoderCacheDataset(args.cache)
    rows = []
    for name, zero in (('zero_init_output=True (V\' = 0)', True),
                       ('paper plain init', False)):
        for seed in range(args.seeds):
            model_cfg = copy.deepcopy(cfg.model)
            model_cfg.bbox_head.califormer.zero_init_output = zero
            torch.manual_seed(seed)
            model = MODELS.build(model_cfg)
            model.init_weights()
            match_config_classes(model, cfg)
            load_checkpoint(
                model, args.dino_checkpoint, map_location='cpu',
                strict=False, logger='silent')
            model.train()
            rows.append((name, seed, mean_losses(model, dataset,
                                                 args.batches)))
    print(f'{args.batches} batches of 4 from {args.cache}, before any '
          'update')
    print('| CaliFormer init | seed | loss | classification | LoMa |')
    print('|---|---|---|---|---|')
    for name, seed, r in rows:
        print(f'| {name} | {seed} | {r["loss"]:.3f} | {r["loss_cls"]:.3f} '
              f'| {r["loss_loma"]:+.4f} |')


if __name__ == '__main__':
    main()
