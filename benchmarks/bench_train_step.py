# Copyright (c) mmcalidet contributors. All rights reserved.
"""Time one training iteration of the demo's DINO against a ResNet-18
forward and backward on the same batch, and print their ratio.

    python benchmarks/bench_train_step.py                 # the demo's DINO
    python benchmarks/bench_train_step.py --profile 15    # + where it goes

The demo's DINO is
``projects/context_shift/configs/dino_tiny_context-shift.py``
(a ResNet-18 from scratch, 2 + 2 layers, 30 queries, 10 classes) and its batch
4 scenes of 128 x 128 px with 2-6 digit-sized boxes each; the batch is made
here (seeded), so no data folder is needed. A training iteration is what
mmengine's loop runs: the data preprocessor, the loss, backward and the
optimizer's step. The reference is mmdet's ResNet-18 (the DINO's backbone
config) alone, forward and backward, on the same images. The backbone holds
most of the FLOPs, so the ratio measures the detector's overhead.

Runs of the two alternate; each time is the minimum over its runs
(interference only adds time) and the ratio's spread is the interquartile
range of per-pair ratios. ``--profile N`` then prints the N costliest
operators of one iteration (torch's profiler, self CPU time) and the N
costliest Python functions (cProfile, cumulative).
"""
import argparse
import cProfile
import io
import os
import os.path as osp
import pstats
import statistics
import sys
import time

import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
CONFIG = 'projects/context_shift/configs/dino_tiny_context-shift.py'


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--size', type=int, default=128)
    parser.add_argument('--iters', type=int, default=12)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument(
        '--mmcv-deform-attn',
        action='store_true',
        help='mmcv\'s own CPU deformable attention (grid_sample), not the '
        'compiled kernel the tiny configs opt into')
    parser.add_argument(
        '--compare-attention',
        action='store_true',
        help='also time the DINO iteration with the compiled kernel\'s and '
        'with mmcv\'s deformable attention, alternating in this process')
    parser.add_argument(
        '--profile',
        type=int,
        default=0,
        metavar='N',
        help='print the N costliest operators and Python functions')
    args = parser.parse_args()
    for name in ('batch_size', 'size', 'iters'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    return args


def make_batch(num: int, size: int, num_classes: int, seed: int = 0):
    """``num`` scenes of ``size`` px with 2-6 boxes of 14-22 px each, packed
    as mmdet's loader packs them (uint8 images, ``DetDataSample``)."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(num):
        inputs.append(
            torch.randint(
                0, 256, (3, size, size), generator=gen, dtype=torch.uint8))
        k = int(torch.randint(2, 7, (1, ), generator=gen))
        wh = torch.randint(14, 23, (k, 2), generator=gen).float()
        xy = torch.rand(k, 2, generator=gen) * (size - wh)
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(size, size),
                ori_shape=(size, size),
                pad_shape=(size, size),
                batch_input_shape=(size, size),
                scale_factor=(1.0, 1.0),
                flip=False))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([xy, xy + wh], 1),
            labels=torch.randint(0, num_classes, (k, ), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def build(config: str):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper

    from testing import match_config_classes
    register_all_modules()
    cfg = Config.fromfile(osp.join(ROOT, config))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    match_config_classes(model, cfg)
    model.train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    backbone = MODELS.build(cfg.model.backbone)
    backbone.init_weights()
    backbone.train()
    return cfg, model, optim, backbone


def detector_step(model, optim, batch) -> None:
    """One iteration as mmengine's ``train_step`` runs it."""
    model.train_step(
        dict(
            inputs=list(batch['inputs']),
            data_samples=list(batch['data_samples'])), optim)


def backbone_step(model, backbone, batch) -> None:
    """ResNet-18 forward and backward on the same normalised images."""
    data = model.data_preprocessor(
        dict(inputs=list(batch['inputs']), data_samples=None), False)
    feats = backbone(data['inputs'])
    sum(f.float().mean() for f in feats).backward()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(fn_a, fn_b, iters: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for k in range(iters):
        if k % 2 == 0:
            times_a.append(timed(fn_a))
            times_b.append(timed(fn_b))
        else:
            times_b.append(timed(fn_b))
            times_a.append(timed(fn_a))
    ratios = [a / b for a, b in zip(times_a, times_b)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [0, 0, 0]
    return dict(
        a=min(times_a),
        b=min(times_b),
        a_median=statistics.median(times_a),
        ratio=min(times_a) / min(times_b),
        iqr=q[2] - q[0])


def profile(fn, top: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    print(f'\nthe {top} costliest operators of one iteration '
          '(torch profiler, self CPU time):')
    print(prof.key_averages().table(
        sort_by='self_cpu_time_total', row_limit=top,
        max_name_column_width=50))
    stats = cProfile.Profile()
    stats.enable()
    fn()
    stats.disable()
    out = io.StringIO()
    pstats.Stats(stats, stream=out).sort_stats('cumulative').print_stats(top)
    print(f'the {top} costliest Python functions of one iteration '
          '(cProfile, cumulative):')
    print('\n'.join(out.getvalue().splitlines()[4:]))


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, model, optim, backbone = build(args.config)
    if args.mmcv_deform_attn:
        from mmcalidet.models.layers.cpu_deform_attn import use_cpu_deform_attn
        use_cpu_deform_attn(False)
    from mmcalidet.models.head_kinds import head_kind_of

    # a two-stage detector classifies RoIs: its head kind's head
    head = head_kind_of(model).head(model)
    batch = make_batch(args.batch_size, args.size, head.num_classes)
    row = paired(lambda: detector_step(model, optim, batch),
                 lambda: backbone_step(model, backbone, batch), args.iters,
                 args.warmup)
    from mmcv.ops import multi_scale_deform_attn as msda
    attention = msda.multi_scale_deformable_attn_pytorch.__module__
    print(f'config={args.config} batch={args.batch_size}x{args.size}px '
          f'threads={torch.get_num_threads()} torch={torch.__version__} '
          f'deformable attention: {attention}')
    print(f'{"step":34s}{"min s":>8s}{"median s":>10s}')
    print(f'{type(model).__name__ + " training iteration":34s}{row["a"]:8.3f}'
          f'{row["a_median"]:10.3f}')
    print(f'{"ResNet-18 forward + backward":34s}{row["b"]:8.3f}')
    print(f'ratio {row["ratio"]:.2f} (per-pair IQR {row["iqr"]:.2f}; '
          'target <= 2.5)')
    if args.compare_attention:
        from mmcalidet.models.layers.cpu_deform_attn import use_cpu_deform_attn

        def step_with(kernel: bool) -> None:
            use_cpu_deform_attn(kernel)
            detector_step(model, optim, batch)

        both = paired(lambda: step_with(True), lambda: step_with(False),
                      args.iters, args.warmup)
        use_cpu_deform_attn(not args.mmcv_deform_attn)
        print(f'{"DINO iteration, kernel attention":34s}{both["a"]:8.3f}'
              f'{both["a_median"]:10.3f}')
        print(f'{"DINO iteration, mmcv attention":34s}{both["b"]:8.3f}')
    if args.profile:
        profile(lambda: detector_step(model, optim, batch), args.profile)


if __name__ == '__main__':
    os.environ.setdefault('OMP_NUM_THREADS', str(os.cpu_count()))
    main()
