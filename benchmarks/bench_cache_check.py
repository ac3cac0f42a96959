# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time the finite check of decoder-cache reads against what the reads
feed.

    python benchmarks/bench_cache_check.py [--max-images 32]

A cache read (``DecoderCache.get`` / ``layers_of``) checks that the hidden
states and boxes of each image are finite the first time the image is
read, so a damaged cache is named instead of scoring NaN. This prints the
check's time over all images of a tiny CaliDINO cache of coco-mini val
(random weights; timing does not depend on them), against one re-scoring
of those images under E_t and a 20-iteration self-calibration, and the
check's time for a batch at DINO-4scale's size (64 x 900 x 256 float32).
Figures are minima over repeats, single-threaded.
"""
import argparse
import time
import timeit

import numpy as np
import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from mmcalidet.calibration import self_calibrate
from mmcalidet.evaluation import Rescorer, cache_hidden_states
from testing import get_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--max-images', type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_default_scope('mmdet')
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.test_dataloader.dataset.indices = args.max_images
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    loader = Runner.build_dataloader(cfg.test_dataloader)
    model.dataset_meta = dict(loader.dataset.metainfo)
    model.eval()
    cache = cache_hidden_states(model, loader, progress=False)
    idx = np.arange(len(cache))
    hidden = np.array(cache.hidden[idx, -1], np.float32)
    boxes = np.array(cache.boxes[idx, -1], np.float32)

    def check():
        cache._finite_last[:] = False
        cache._check_finite(idx, hidden, boxes)

    t_check = min(timeit.repeat(check, number=1, repeat=20))
    rescorer = Rescorer(model, cache)
    prior = model.get_prior()
    t_rescore = min(
        timeit.repeat(lambda: rescorer.predict(prior), number=1, repeat=3))
    start = time.perf_counter()
    self_calibrate(model, cache, iters=20, tol=0)
    t_selfcal = time.perf_counter() - start
    print(f'tiny CaliDINO, {len(cache)} images, hidden {hidden.shape}: '
          f'finite check of every image {1e3 * t_check:.2f} ms; one '
          f're-scoring {1e3 * t_rescore:.1f} ms '
          f'({100 * t_check / t_rescore:.2f} %); 20-iteration '
          f'self-calibration {t_selfcal:.2f} s '
          f'({100 * t_check / t_selfcal:.3f} %)')
    big = np.random.default_rng(0).standard_normal((64, 900, 256),
                                                   dtype=np.float32)
    t_big = min(
        timeit.repeat(lambda: np.isfinite(big).all(), number=1, repeat=10))
    print(f'DINO-4scale batch (64 x 900 x 256 float32): finite check '
          f'{1e3 * t_big:.1f} ms')


if __name__ == '__main__':
    main()
