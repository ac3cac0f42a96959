# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX Runtime against PyTorch, and the prior's cost in an ONNX graph.

    python benchmarks/bench_onnx.py                      # tiny and R50 DINO
    python benchmarks/bench_onnx.py --models tiny --iters 50
    python benchmarks/bench_onnx.py --models rtmdet      # one-stage
    python benchmarks/bench_onnx.py --models faster-rcnn # two-stage

For each detector (the tiny coco-mini CaliDINO at 256 x 256, the
DINO-4scale R50 CaliDINO at ``--r50-size``, the tiny CaliRTMDet and
CaliFasterRCNN at 256 x 256; random weights: a DETR's cost does not
depend on them, a one-stage head's class bias is set so that few
locations pass ``score_thr``, as after training), batch 1, on the same
real coco-mini image; a one- or two-stage detector's ONNX Runtime time
includes the NumPy post-processing:

* ONNX Runtime (the prior-input graph) vs PyTorch eager (the same
  forward, the prior given per call); goal: ONNX Runtime >= 1.5x faster;
* the prior-input graph vs the folded one (``--fold-prior``); goal: at
  most 3 % slower;
* the folded graph vs the plain DINO's export; goal: at most 1 % slower.

Runs of the compared graphs alternate and each ratio is the median of
per-pair ratios, which cancels most drift of the machine's speed.
"""
import argparse
import os.path as osp
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from testing import data_root, get_config  # noqa: E402

#: (CaliDet config, plain config, default size) per model
MODELS = {
    'tiny': ('calidet/calidet_dino_tiny_coco-mini.py',
             'calidet/dino_tiny_coco-mini.py', 256),
    'r50': ('calidet/calidet_dino-4scale_r50_8xb2-6e_coco.py',
            'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', 512),
    'rtmdet': ('calidet/calidet_rtmdet_tiny_coco-mini.py',
               'calidet/rtmdet_tiny_coco-mini.py', 256),
    'faster-rcnn': ('calidet/calidet_faster-rcnn_tiny_coco-mini.py',
                    'calidet/faster-rcnn_tiny_coco-mini.py', 256),
}
TARGETS = dict(
    ort_speedup=1.5, prior_input_vs_folded=1.03, folded_vs_plain=1.01)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--models',
        nargs='+',
        choices=sorted(MODELS),
        default=['tiny', 'r50', 'rtmdet'])
    parser.add_argument(
        '--r50-size',
        type=int,
        default=512,
        help='input H = W of the R50 model (512)')
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    return parser.parse_args()


def build(name: str):
    """A model of a config with random weights (no pretrained download)."""
    from mmdet.registry import MODELS as REGISTRY
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    if name.startswith('mmdet::'):  # mmdet's own config, as _base_ reads it
        import mmdet
        cfg = Config.fromfile(
            osp.join(
                osp.dirname(mmdet.__file__), '.mim', 'configs',
                name[len('mmdet::'):]))
    else:
        cfg = get_config(name)
    init_default_scope('mmdet')
    cfg.model.backbone.pop('init_cfg', None)
    from mmcalidet.utils.log_level import mmengine_log_level
    torch.manual_seed(0)
    model = REGISTRY.build(cfg.model)
    with mmengine_log_level(at_least=40):  # init_weights' report
        model.init_weights()
    from mmcalidet.models.head_kinds import DENSE, head_kind_of
    if head_kind_of(model) is DENSE:
        # a one-stage head's NMS costs what its scores make it cost: at
        # the init's bias (sigmoid 0.01) every (location, class) pair
        # passes score_thr = 0.001; a trained head scores most of them
        # far below it, as this bias (sigmoid 1e-4) does
        from mmengine.model import bias_init_with_prob
        with torch.no_grad():
            for conv in DENSE.cls_layers(model.bbox_head).values():
                conv.bias.fill_(bias_init_with_prob(1e-4))
    model.cfg = cfg
    return model.eval()


def median_ratio(first, second, iters: int, warmup: int) -> tuple:
    """Median seconds of each callable and the median of per-pair
    ratios (first / second), runs alternating."""
    times = ([], [])
    for step in range(warmup + iters):
        for k, run in enumerate((first, second)):
            start = time.perf_counter()
            run()
            if step >= warmup:
                times[k].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(*times)]
    return (statistics.median(times[0]), statistics.median(times[1]),
            statistics.median(ratios))


def bench(key: str, size: int, args) -> list:
    from mmcalidet.deploy import (ExportWrapper, OnnxDetector, export_onnx,
                                  fold_prior)
    cali_name, plain_name, _ = MODELS[key]
    image = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                     '000000000139.jpg')
    cali, plain = build(cali_name), build(plain_name)
    prior = cali.get_prior()
    folded = fold_prior(cali, prior)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for what, model, prior_input in (('prior', cali,
                                          True), ('folded', folded, False),
                                         ('plain', plain, False)):
            start = time.perf_counter()
            files[what] = export_onnx(
                model,
                osp.join(tmp, f'{what}.onnx'), (size, size),
                prior_input=prior_input)
            print(
                f'  exported {key} {what} in '
                f'{time.perf_counter() - start:.1f} s',
                flush=True)
        import onnx
        nodes = {
            what: len(onnx.load(path).graph.node)
            for what, path in files.items()
        }
        print(
            '  graph nodes: ' + ', '.join(f'{what} {num}'
                                          for what, num in nodes.items()),
            flush=True)
        sessions = {
            what: OnnxDetector(path, threads=args.threads)
            for what, path in files.items()
        }
        tensor = sessions['prior'].preprocess(image)[0]
        prior32 = prior.astype('float32')

        def ort(what):
            return lambda: sessions[what].run_input(
                tensor, prior32 if what == 'prior' else None)

        wrapper = ExportWrapper(cali, (size, size), prior_input=True)
        torch_input = torch.from_numpy(tensor)
        torch_prior = torch.from_numpy(prior32)

        def eager():
            with torch.no_grad():
                wrapper(torch_input, torch_prior)

        pairs = (('ort_speedup', eager, ort('prior'), 'PyTorch eager',
                  'ONNX Runtime (prior input)'),
                 ('prior_input_vs_folded', ort('prior'), ort('folded'),
                  'prior-input graph', 'folded graph'),
                 ('folded_vs_plain', ort('folded'), ort('plain'),
                  'folded graph', 'plain graph'))
        for name, first, second, label_a, label_b in pairs:
            a, b, ratio = median_ratio(first, second, args.iters, args.warmup)
            target = TARGETS[name]
            holds = ratio >= target if name == 'ort_speedup' \
                else ratio <= target
            rows.append((key, size, label_a, a, label_b, b, ratio, target,
                         holds, name))
            print(
                f'  {label_a} {a * 1e3:.1f} ms vs {label_b} '
                f'{b * 1e3:.1f} ms: {ratio:.3f}',
                flush=True)
    return rows


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings('ignore')
    rows = []
    for key in args.models:
        size = args.r50_size if key == 'r50' else MODELS[key][2]
        print(
            f'{key} ({size} x {size}), batch 1, {args.threads} threads:',
            flush=True)
        rows += bench(key, size, args)
    print('\n| model | input | A | A ms | B | B ms | A / B | goal | holds |')
    print('|---|---|---|---|---|---|---|---|---|')
    for key, size, la, a, lb, b, ratio, target, holds, name in rows:
        goal = f'>= {target}' if name == 'ort_speedup' else f'<= {target}'
        print(f'| {key} | {size} | {la} | {a * 1e3:.1f} | {lb} | '
              f'{b * 1e3:.1f} | {ratio:.3f} | {goal} | '
              f'{"yes" if holds else "no"} |')


if __name__ == '__main__':
    main()
