# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time the cached evaluation protocol against one evaluation pass.

    python benchmarks/bench_eval_cache.py                 # tiny CaliDINO, CPU
    python benchmarks/bench_eval_cache.py --device cuda \
        --config calidet/calidet_dino-4scale_r50_8xb2-6e_coco.py

On the same images (coco-mini val2017, the config's test pipeline):

* ``pass``: one evaluation pass as ``tools/test.py`` makes it: data
  loading, ``model.test_step`` per batch under E_t, COCO metrics;
* ``sweep``: the 6-prior table (flip(E_x), E0, E_t, E_v, E_b, E_x): one
  cached pass, then re-scoring + COCO metrics per prior
  (target <= 1.3 x pass);
* ``selfcal``: 20 self-calibration iterations on all images (the
  deployment case, no annotations): one cached pass, then 21 re-scorings
  (target <= 2 x pass);
* ``selfcal+AP``: the same with COCO AP at every iteration (the paper's
  curves): 21 COCO evaluations more.

Each figure is the minimum over ``--repeats`` runs (the machine's other
load only adds time).

It checks that the cached E_t predictions equal the pass's, and prints
the cache's memory per image (and what it would be for DINO-4scale,
Q = 900, d = 256). With ``--cache-dir`` it also times the cache pass into
a cache folder and a later run's reuse of it (validation and memory maps,
no detector pass), and checks the reused cache scores alike. Weights are
random unless ``--checkpoint`` is given (timing does not depend on them).
"""
import argparse
import os.path as osp
import sys
import time
from typing import Dict, List, Tuple

import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, load_checkpoint

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mmcalidet.calibration import self_calibrate
from mmcalidet.decoder_cache import weights_fingerprint
from mmcalidet.evaluation import (CocoEvaluator, Rescorer, cache_evaluator,
                                  cache_hidden_states)
from mmcalidet.evaluation.protocol import injection
from mmcalidet.evaluation.sweep import Method
from mmcalidet.utils.log_level import quiet_mmengine
from testing import get_config

TARGETS = dict(sweep=1.3, selfcal=2.0, selfcal_ap=None)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--config', default='calidet/calidet_dino_tiny_coco-mini.py')
    parser.add_argument('--checkpoint', default=None)
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--max-images', type=int, default=None, help='default all (79)')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument(
        '--size', type=int, default=None, help='image scale (config: 256)')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument(
        '--cache-dir',
        default=None,
        help='also time writing a cache folder here and reusing it')
    return parser.parse_args()


def one_pass(model, loader, evaluator):
    preds, ids = [], []
    with torch.no_grad():
        for batch in loader:
            for out in model.test_step(batch):
                preds.append(out.pred_instances.cpu())
                ids.append(out.metainfo['img_id'])
    return evaluator.evaluate(ids, preds), preds


def build_model_and_data(args: argparse.Namespace) -> Tuple:
    """The config's test loader, its model (checkpoint loaded, eval mode)
    and its COCO evaluator.

    Args:
        args (argparse.Namespace): the benchmark's options.

    Returns:
        tuple: the model, the loader and the evaluator.
    """
    cfg = get_config(args.config)
    if args.max_images:
        cfg.test_dataloader.dataset.indices = args.max_images
    if args.size:
        cfg.test_dataloader.dataset.pipeline[1].scale = (args.size, args.size)
    cfg.test_dataloader.batch_size = args.batch_size
    loader = Runner.build_dataloader(cfg.test_dataloader)
    classes = loader.dataset.metainfo['classes']
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    # first: a non-strict load keeps the init of what the checkpoint lacks
    # (mmdet's level_embed starts uninitialised)
    model.init_weights()
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint, map_location='cpu')
    model.dataset_meta = dict(loader.dataset.metainfo)
    model = model.to(args.device).eval()
    return model, loader, CocoEvaluator(cfg.test_evaluator.ann_file, classes)


def time_repeats(model, loader, evaluator: CocoEvaluator,
                 repeats: int) -> Tuple[Dict[str, List[float]], object, List]:
    """Time, ``repeats`` times each: a full evaluation pass, a 6-prior
    sweep on a fresh cache, and 20 self-calibration iterations without and
    with an AP each.

    Args:
        model: the CaliDet model.
        loader: its test loader.
        evaluator (CocoEvaluator): the loader's annotations.
        repeats (int): how often each is timed.

    Returns:
        tuple: the times by key, the last cache and the full pass's
        predictions.
    """
    evaluate = cache_evaluator(evaluator)
    train_prior = model.get_prior()
    with torch.no_grad():  # warm-up (first-call allocations)
        model.test_step(next(iter(loader)))

    times = dict(pass_=[], sweep=[], selfcal=[], selfcal_ap=[])
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, full = one_pass(model, loader, evaluator)
        times['pass_'].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        cache = cache_hidden_states(model, loader, progress=False)
        # the standard table: flip(E_x), E0, E_t, E_v, E_b, E_x
        injection([Method('CaliDet', Rescorer(model, cache))],
                  evaluate,
                  train_prior,
                  progress=False)
        times['sweep'].append(time.perf_counter() - t0)

        for key, with_ap in (('selfcal', False), ('selfcal_ap', True)):
            t0 = time.perf_counter()
            cache = cache_hidden_states(model, loader, progress=False)
            self_calibrate(
                model,
                cache,
                iters=20,
                tol=0.0,
                evaluate=(lambda preds: evaluate(cache, preds))
                if with_ap else None)
            times[key].append(time.perf_counter() - t0)
    return times, cache, full


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_mmengine()
    init_default_scope('mmdet')
    model, loader, evaluator = build_model_and_data(args)
    train_prior = model.get_prior()
    times, cache, full = time_repeats(model, loader, evaluator, args.repeats)

    cached = Rescorer(model, cache).predict(train_prior)
    same = all(
        torch.equal(a.labels, b.labels)
        and torch.allclose(a.scores, b.scores, atol=1e-6)
        and torch.allclose(a.bboxes, b.bboxes, atol=1e-4)
        for a, b in zip(cached, full))
    t_pass = min(times['pass_'])
    print(f'{len(cache)} images, batch {args.batch_size}, '
          f'device {args.device}, threads {torch.get_num_threads()}')
    print(f'one evaluation pass: {t_pass:.2f} s')
    for key, label in (('sweep', '6-prior sweep'),
                       ('selfcal', '20 self-calibration iterations'),
                       ('selfcal_ap', '20 self-calibration iterations '
                        'with AP each')):
        t = min(times[key])
        ratio = t / t_pass
        target = TARGETS[key]
        verdict = '' if target is None else (
            f'(target <= {target}) ' +
            ('ok' if ratio <= target else 'ABOVE TARGET'))
        print(f'{label}: {t:.2f} s = {ratio:.2f} x pass {verdict}')
    q, d = cache.num_queries, cache.embed_dims
    print(f'cache: {cache.bytes_per_image} bytes/image (Q={q}, d={d}); '
          f'DINO-4scale (Q=900, d=256): {900 * 260 * 4 / 2**20:.2f} MiB/'
          f'image, {5000 * 900 * 260 * 4 / 2**30:.2f} GiB for COCO val2017')
    print(f'cached E_t predictions equal the full pass: {same}')
    if args.cache_dir:
        folder_timings(model, loader, args.cache_dir, cached, train_prior)


def folder_timings(model, loader, cache_dir, cached, train_prior) -> None:
    """Time a cache pass into a folder and a second run reusing it."""
    fingerprint = dict(benchmark=weights_fingerprint(model))
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        cache = cache_hidden_states(
            model,
            loader,
            cache_dir=cache_dir,
            fingerprint=fingerprint,
            progress=False)
        times.append((time.perf_counter() - t0, cache.reused))
    reused = Rescorer(model, cache).predict(train_prior)
    same = all(
        torch.equal(a.labels, b.labels) and torch.equal(a.scores, b.scores)
        for a, b in zip(reused, cached))
    print(f'cache folder {cache.folder}: first run {times[0][0]:.2f} s '
          f'(reused: {times[0][1]}), second run {times[1][0]:.3f} s '
          f'(reused: {times[1][1]}); scores equal the in-memory cache: '
          f'{same}')


if __name__ == '__main__':
    main()
