# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time the cached calibrator step and V' with the support-aware prior
(experimental, a relation-reading candidate) against the default, and print
the ratios (the budget: the training step at most 20 % slower).

    python benchmarks/bench_support_prior.py

Both models are built with the same seed (random weights, a random E_t, no
data needed); steps alternate on the same cached decoder outputs of one
batch, each with its config's optimizer; the ratio is the median of
per-pair ratios. V' is timed for the deployment prior (one K x K prior,
with support for the candidate), gradients off, without the cache.
"""
import argparse
import copy
import os.path as osp
import statistics
import sys

import numpy as np
import torch
from mmdet.utils import register_all_modules

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from bench_cached_calibrator import build, timed  # noqa: E402

from mmcalidet.evaluation.cache import run_decoder  # noqa: E402
from testing import demo_batch, get_config  # noqa: E402

CONFIGS = '../projects/context_shift/configs/'
TARGET = 1.2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--config',
        default=CONFIGS + 'calidet_dino_tiny_context-shift_cached.py')
    parser.add_argument(
        '--support-config',
        default=CONFIGS + 'calidet_dino_tiny_context-shift_cached_support.py')
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--size', type=int, default=128)
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--threads', type=int, default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    register_all_modules()
    models = []
    for name in (args.config, args.support_config):
        cfg = get_config(name)
        model, _, optim = build(cfg, cfg)
        models.append((model, optim))
    k = models[0][0].num_classes
    rng = np.random.default_rng(0)
    labels = [
        rng.choice(k, size=rng.integers(2, 7), replace=True).tolist()
        for _ in range(args.batch_size)
    ]
    base = models[0][0].eval()
    with torch.no_grad():
        samples, hidden, (_, boxes) = run_decoder(
            base, demo_batch(labels, size=args.size))
    cached = dict(
        inputs=dict(
            hidden_states=list(hidden.transpose(0, 1)),
            bbox_preds=list(boxes.transpose(0, 1))),
        data_samples=samples)

    def step(model, optim):
        model.train()
        data = model.data_preprocessor(copy.deepcopy(cached), True)
        optim.update_params(sum(model(**data, mode='loss').values()))

    for _ in range(args.warmup):
        for pair in models:
            step(*pair)
    off_t, on_t, ratios = [], [], []
    for _ in range(args.iters):
        off, on = timed(lambda: step(*models[0])), timed(
            lambda: step(*models[1]))
        off_t.append(off)
        on_t.append(on)
        ratios.append(on / off)

    support_model = models[1][0].eval()
    support_model.set_prior(
        support_model.get_prior(),
        support=np.full(k, 2000.0),
        marginals=np.full(k, 0.3))
    v_times = []
    for model, _ in models:
        model.eval()
        with torch.no_grad():
            times = [
                timed(lambda: model.bbox_head.get_cali_vectors(
                    model.prior, *model.deployment_support()))
                for _ in range(args.iters)
            ]
        v_times.append(statistics.median(times))
    ratio = statistics.median(ratios)
    print(f'{args.iters} pairs, batch {args.batch_size}, '
          f'{torch.get_num_threads()} threads')
    print(f'cached step, default:       '
          f'{1e3 * statistics.median(off_t):.2f} ms (median)')
    print(f'cached step, support prior: '
          f'{1e3 * statistics.median(on_t):.2f} ms (median)')
    print(f'ratio (median of pairs): {ratio:.3f} (budget <= {TARGET}): '
          f'{"met" if ratio <= TARGET else "NOT met"}')
    print(f"V' of one prior: default {1e3 * v_times[0]:.2f} ms, "
          f'support prior {1e3 * v_times[1]:.2f} ms')


if __name__ == '__main__':
    main()
