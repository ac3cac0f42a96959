# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time a calibrator step on cached decoder outputs against a full CaliDINO
training step, and print the ratio (target: the cached step >= 50x
cheaper).

    python benchmarks/bench_cached_calibrator.py            # context-shift
    python benchmarks/bench_cached_calibrator.py --config \
        calidet/calidet_dino_tiny_coco-mini_cached.py --size 256
    # the paper's model (DINO-4scale R50, 900 queries, 80 classes), random
    # weights: minutes per pair on a CPU, about 10 GiB
    python benchmarks/bench_cached_calibrator.py \
        --config calidet/calidet_dino-4scale_r50_8xb2-cached_coco.py \
        --full-config calidet/calidet_dino-4scale_r50_8xb2-6e_coco.py \
        --batch-size 2 --size 800 --iters 2 --warmup 1

Both steps run on the same batch (random scenes with 2-6 objects each, the
config's image size) with the config's optimizer (AdamW, gradient
clipping): the full step is the data preprocessor (EdgeSampler), backbone,
transformer, head losses (denoising included), backward and the optimizer
step; the cached step is the preprocessor (EdgeSampler) on cached decoder
outputs of that batch, the CaliFormer, the calibrated logits of every
decoder layer, matching, focal and LoMa losses, backward and the optimizer
step (over the CaliFormer only). Each step has its config's optimizer.
Steps alternate; the ratio is the median of per-pair ratios.
"""
import argparse
import copy
import os.path as osp
import statistics
import sys
import time

import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.optim import build_optim_wrapper

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mmcalidet.evaluation.cache import run_decoder  # noqa: E402
from testing import match_config_classes  # noqa: E402
from testing import demo_batch, get_config

TARGET = 50.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--config',
        default='../projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift_cached.py')
    parser.add_argument(
        '--full-config',
        default='../projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift.py',
        help='the full fine-tune\'s config (its optimizer)')
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument(
        '--size', type=int, default=128, help='image height and width')
    parser.add_argument('--iters', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--threads', type=int, default=None)
    return parser.parse_args()


def build(cfg, full_cfg):
    """The model (random prior of the config's K, so no data is needed)
    and the optimizers of the full fine-tune and of the cached training."""
    k = cfg.model.bbox_head.num_classes
    rng = np.random.default_rng(0)
    prior = rng.uniform(size=(k, k))
    np.fill_diagonal(prior, 1.0)
    cfg.model.prior = prior  # the EdgeSampler's E_t too
    # random weights: timing only, and nothing may be downloaded
    cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    match_config_classes(model, cfg)
    return model, build_optim_wrapper(model, full_cfg.optim_wrapper), \
        build_optim_wrapper(model, cfg.optim_wrapper)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    register_all_modules()
    cfg = get_config(args.config)
    model, full_optim, cached_optim = build(cfg,
                                            get_config(args.full_config))
    k = cfg.model.bbox_head.num_classes
    rng = np.random.default_rng(0)
    labels = [
        rng.choice(k, size=rng.integers(2, 7), replace=True).tolist()
        for _ in range(args.batch_size)
    ]
    images = demo_batch(labels, size=args.size)

    # the cached outputs of this batch (eval mode, as the cache is made)
    model.eval()
    with torch.no_grad():
        samples, hidden, (_, boxes) = run_decoder(model,
                                                  copy.deepcopy(images))
    cached = dict(
        inputs=dict(
            hidden_states=list(hidden.transpose(0, 1)),
            bbox_preds=list(boxes.transpose(0, 1))),
        data_samples=samples)
    model.train()

    def step(batch, optim):
        data = model.data_preprocessor(copy.deepcopy(batch), True)
        optim.update_params(sum(model(**data, mode='loss').values()))

    def full():
        step(images, full_optim)

    def cached_step():
        step(cached, cached_optim)

    for _ in range(args.warmup):
        full()
        cached_step()
    full_t, cached_t, ratios = [], [], []
    for _ in range(args.iters):
        f, c = timed(full), timed(cached_step)
        full_t.append(f)
        cached_t.append(c)
        ratios.append(f / c)
    f_med = statistics.median(full_t)
    c_med = statistics.median(cached_t)
    ratio = statistics.median(ratios)
    print(f'config: {args.config}, batch {args.batch_size} x {args.size} '
          f'px, {torch.get_num_threads()} threads, {args.iters} pairs')
    print(f'full CaliDINO training step: {1e3 * f_med:.1f} ms (median)')
    print(f'cached calibrator step:      {1e3 * c_med:.2f} ms (median)')
    print(f'ratio (median of pairs): {ratio:.1f}x cheaper '
          f'(target >= {TARGET:.0f}x): '
          f'{"met" if ratio >= TARGET else "NOT met"}')


if __name__ == '__main__':
    main()
