# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time a CaliDet detector against its plain twin (same budget) and print
the ratios.

    python benchmarks/bench_overhead.py            # tiny DINOs, CPU
    python benchmarks/bench_overhead.py --device cuda --size 800
    python benchmarks/bench_overhead.py \
        --cali-config calidet/calidet_rtmdet_tiny_coco-mini.py \
        --base-config calidet/rtmdet_tiny_coco-mini.py   # one-stage

Measures, on the same real coco-mini images:

* a training step (data preprocessor incl. EdgeSampler, loss, backward,
  optimizer step) of the CaliDet detector vs the plain one (target
  <= 1.10);
* inference (``predict``) with V' cached (the deployment case, target
  <= 1.005) and uncached (V' recomputed every forward, target <= 1.03).

Runs of the two models alternate and each ratio is the median of per-pair
ratios, which cancels most drift of the machine's speed.
"""
import argparse
import copy
import os
import os.path as osp
import statistics
import sys
import time

import torch
from mmdet.registry import DATASETS, MODELS
from mmdet.utils import register_all_modules
from mmengine.config import DictAction
from mmengine.dataset import pseudo_collate
from mmengine.optim import build_optim_wrapper

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mmcalidet.models.head_kinds import DENSE, head_kind_of  # noqa: E402
from testing import get_config, match_config_classes  # noqa: E402

TARGETS = dict(train=1.10, infer_cached=1.005, infer_uncached=1.03)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--cali-config', default='calidet/calidet_dino_tiny_coco-mini.py')
    parser.add_argument(
        '--base-config', default='calidet/dino_tiny_coco-mini.py')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument(
        '--size', type=int, default=None, help='image scale (config: 256)')
    parser.add_argument('--train-iters', type=int, default=20)
    parser.add_argument('--infer-iters', type=int, default=60)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        default={},
        help='override the CaliDet config, e.g. '
        'model.bbox_head.califormer.num_layers=3')
    return parser.parse_args()


def build(name: str, args: argparse.Namespace, options=None):
    cfg = get_config(name)
    cfg.merge_from_dict(options or {})
    if args.size is not None:
        for pipeline in (cfg.train_dataloader.dataset.pipeline,
                         cfg.test_dataloader.dataset.pipeline):
            for t in pipeline:
                if t['type'] == 'Resize':
                    t['scale'] = (args.size, args.size)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).to(args.device)
    model.init_weights()
    match_config_classes(model, cfg)
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    return cfg, model, optim


def load_batch(cfg, split: str, num: int) -> dict:
    loader = cfg.train_dataloader if split == 'train' \
        else cfg.test_dataloader
    dataset = DATASETS.build(loader.dataset)
    return pseudo_collate([dataset[i] for i in range(num)])


def sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def train_step(model, optim, batch, device):
    model.train()
    sync(device)
    start = time.perf_counter()
    data = model.data_preprocessor(copy.deepcopy(batch), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    loss, _ = model.parse_losses(losses)
    optim.update_params(loss)
    sync(device)
    return time.perf_counter() - start


def infer_step(model, batch, device, drop_cache=False):
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        if drop_cache:
            model._cali_cache = None
        sync(device)
        start = time.perf_counter()
        model.predict(data['inputs'], data['data_samples'])
        sync(device)
    return time.perf_counter() - start


def paired(fn_a, fn_b, iters: int, warmup: int) -> dict:
    """Alternate a and b.

    Returns:
        dict: minimum times (interference only adds time, so the minimum
        is the steadiest estimate of the cost), their ratio, and the median
        and interquartile range of the per-pair ratios (the noise).
    """
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for k in range(iters):
        first, second = (fn_a, fn_b) if k % 2 == 0 else (fn_b, fn_a)
        t1, t2 = first(), second()
        times_a.append(t1 if k % 2 == 0 else t2)
        times_b.append(t2 if k % 2 == 0 else t1)
    ratios = [a / b for a, b in zip(times_a, times_b)]
    quartiles = statistics.quantiles(ratios, n=4)
    return dict(
        a=min(times_a),
        b=min(times_b),
        ratio=min(times_a) / min(times_b),
        median=statistics.median(ratios),
        iqr=quartiles[2] - quartiles[0])


def best_time(fn, reps: int, blocks: int = 5) -> float:
    """Seconds per call of ``fn``: the best of ``blocks`` averages."""
    fn()
    best = float('inf')
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def added_inference_work(model, batch, device, reps: int) -> dict:
    """Seconds of the work CaliDet adds to the plain detector's predict,
    timed alone: the per-sample prior check, the V' cache lookup and the
    calibration of the classifiers (cached), plus the CaliFormer
    (uncached). The calibration is a DETR head's ``rho V'^T h`` on every
    decoder layer's logits, or a dense head's ``W_l + rho V'`` on every
    level's classification conv."""
    model.eval()
    head = model.bbox_head
    with torch.no_grad():
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        samples = data['data_samples']
        if head_kind_of(model) is DENSE:
            convs = DENSE.level_convs(head)

            def calibrate(cali_vectors):
                for conv in convs:
                    conv.weight + head.rho * conv.channel_deltas(
                        cali_vectors)[..., None, None]
        else:
            head_inputs = super(type(model), model).forward_transformer(
                model.extract_feat(data['inputs']), samples)
            hidden = head_inputs['hidden_states']
            logits = hidden.new_zeros(*hidden.shape[:3], model.num_classes)

            def calibrate(cali_vectors):
                head.calibrate_cls_scores(logits, hidden, cali_vectors)

        def cached():
            model.batch_priors(samples)
            calibrate(model.deployment_cali_vectors())
            sync(device)

        def califormer():
            head.get_cali_vectors(model.prior)
            sync(device)

        return dict(
            cached=best_time(cached, reps),
            califormer=best_time(califormer, max(reps // 10, 1)))


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    register_all_modules()
    cali_cfg, cali, cali_optim = build(args.cali_config, args,
                                       args.cfg_options)
    _, base, base_optim = build(args.base_config, args)
    # the twins share every weight (the CaliFormer and the prior are the
    # CaliDet one's alone): with V' = 0 at the start both predict the same
    # boxes, so post-processing (an NMS over what random weights score)
    # costs both the same and the ratios measure CaliDet's own work
    base.load_state_dict(cali.state_dict(), strict=False)
    train_batch = load_batch(cali_cfg, 'train', args.batch_size)
    test_batch = load_batch(cali_cfg, 'test', args.batch_size)

    # inference first, while the twins share their weights (training
    # moves them apart, and a dense head's NMS costs what its scores make
    # it cost)
    rows = {}
    for name, drop in (('infer_cached', False), ('infer_uncached', True)):
        rows[name] = paired(
            lambda: infer_step(cali, test_batch, args.device, drop),
            lambda: infer_step(base, test_batch, args.device),
            args.infer_iters, args.warmup)
    added = added_inference_work(
        cali, test_batch, args.device, reps=20 * args.infer_iters)
    rows = dict(
        train=paired(
            lambda: train_step(cali, cali_optim, train_batch, args.device),
            lambda: train_step(base, base_optim, train_batch, args.device),
            args.train_iters, args.warmup),
        **rows)
    base_infer = min(rows['infer_cached']['b'], rows['infer_uncached']['b'])

    cali_name, base_name = type(cali).__name__, type(base).__name__
    print(f'device={args.device} threads={torch.get_num_threads()} '
          f'batch={args.batch_size} torch={torch.__version__} '
          f'CaliFormer layers='
          f'{cali.bbox_head.califormer.encoder.num_layers}')
    print(f'{"step":16s}{cali_name + " ms":>14s}{base_name + " ms":>12s}'
          f'{"ratio":>9s}{"median":>9s}{"IQR":>8s}{"target":>9s}')
    for name, r in rows.items():
        print(f'{name:16s}{r["a"] * 1e3:14.1f}{r["b"] * 1e3:12.1f}'
              f'{r["ratio"]:9.4f}{r["median"]:9.4f}{r["iqr"]:8.4f}'
              f'{"<=" + format(TARGETS[name], ".3f"):>9s}')
    print('(ratio: of the minimum times; median/IQR: of the per-pair '
          'ratios)')
    cached = added['cached']
    uncached = cached + added['califormer']
    print(f'work added to a predict, timed alone: cached '
          f'{cached * 1e3:.3f} ms = {cached / base_infer:.2%} of '
          f'{base_name}, uncached {uncached * 1e3:.3f} ms = '
          f'{uncached / base_infer:.2%} (CaliFormer '
          f'{added["califormer"] * 1e3:.2f} ms)')


if __name__ == '__main__':
    os.environ.setdefault('OMP_NUM_THREADS', str(os.cpu_count()))
    main()
