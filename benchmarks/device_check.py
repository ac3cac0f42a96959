# Copyright (c) mmcalidet contributors. All rights reserved.
"""Check a GPU install end to end on the tiny CaliDINO, in a few minutes.

    .venv/bin/python benchmarks/device_check.py [--out device_check.json]

On one seeded, ``init_weights``-initialised CaliDINO of
``configs/calidet/calidet_dino_tiny_coco-mini.py`` (random images from
:func:`testing.demo_batch`, TF32 off):

1. parity: backbone/neck features and the head's outputs (all decoder
   layers' class logits and boxes) of the same model on CPU and on CUDA
   (the CUDA side runs mmcv's CUDA deformable-attention kernel, the CPU
   side its PyTorch fallback);
2. training: a few AdamW steps on CUDA (EdgeSampler priors, LoMa), every
   loss finite;
3. inference with a prior through ``mmcalidet.apis`` (``init_detector`` on
   a checkpoint of the model, ``inference_detector`` under E0 and a
   shipped prior), scores finite;
4. throughput: images/s of ``predict`` (V' cached) and of training steps.

Without CUDA it says so, skips the CUDA parts (1, 2 and the CUDA side of 3
and 4) and runs the rest on CPU. Exit status 1 when a check fails.
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from testing import (demo_batch, get_config,  # noqa: E402
                     match_config_classes, train_steps)

CONFIG = 'calidet/calidet_dino_tiny_coco-mini.py'
#: what the parity check tolerates (float32, TF32 off)
FEATURE_RTOL = 1e-4
OUTPUT_ATOL = 2e-3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', type=int, default=256, help='image size')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--train-steps', type=int, default=5)
    parser.add_argument(
        '--iters', type=int, default=20, help='timed iterations on CUDA')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', help='also write the results as JSON')
    return parser.parse_args()


def build_model(seed: int) -> torch.nn.Module:
    """The tiny CaliDINO, seeded and initialised, on CPU."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules()
    torch.manual_seed(seed)
    cfg = get_config(CONFIG)
    model = MODELS.build(cfg.model)
    model.init_weights()
    match_config_classes(model, cfg)
    return model


def flat_tensors(outputs) -> list:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for o in outputs for t in flat_tensors(o)]


def forward_outputs(model, batch) -> tuple:
    """Features and head outputs (float32, on CPU) of the eval forward."""
    model.eval()
    data = model.data_preprocessor(copy.deepcopy(batch), False)
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        outs = model._forward(data['inputs'], data['data_samples'])
    return ([f.float().cpu() for f in feats],
            [o.float().cpu() for o in flat_tensors(outs)])


def check_parity(model, batch) -> dict:
    """CPU vs CUDA forward of the same weights on the same inputs."""
    cpu_feats, cpu_outs = forward_outputs(model, batch)
    cuda_model = copy.deepcopy(model).cuda()
    gpu_feats, gpu_outs = forward_outputs(cuda_model, batch)
    feat_err = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-12)
                    ).item() for a, b in zip(cpu_feats, gpu_feats))
    out_err = max((a - b).abs().max().item()
                  for a, b in zip(cpu_outs, gpu_outs))
    finite = all(torch.isfinite(t).all() for t in cpu_outs + gpu_outs)
    return dict(
        ok=bool(finite and feat_err <= FEATURE_RTOL
                and out_err <= OUTPUT_ATOL),
        feature_max_rel_err=feat_err,
        output_max_abs_err=out_err,
        tolerances=dict(feature_rtol=FEATURE_RTOL, output_atol=OUTPUT_ATOL),
        finite=bool(finite))


def check_training(model, batch, steps: int, device: str) -> dict:
    """A few training steps; every loss must be finite."""
    model = copy.deepcopy(model).to(device)
    start = time.perf_counter()
    losses = train_steps(model, batch, steps=steps)
    if device == 'cuda':
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return dict(
        ok=bool(np.all(np.isfinite(losses))),
        losses=losses,
        images_per_s=steps * len(batch['inputs']) / seconds)


def check_inference(model, device: str, size: int) -> dict:
    """``init_detector`` on a checkpoint of the model, then
    ``inference_detector`` under E0 and under a shipped prior."""
    from mmengine.runner import save_checkpoint

    from mmcalidet.apis import inference_detector, init_detector
    from mmcalidet.priors import flat_prior
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = osp.join(tmp, 'model.pth')
        save_checkpoint(dict(state_dict=model.state_dict()), ckpt)
        config = osp.join(
            osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs',
            CONFIG)
        detector = init_detector(config, ckpt, device=device)
    scores = {}
    for name, prior in (('E0', flat_prior(model.num_classes)),
                        ('coco2017_val', 'coco2017_val')):
        result = inference_detector(detector, image, prior=prior)
        scores[name] = result.pred_instances.scores.float().cpu()
    finite = all(torch.isfinite(s).all() for s in scores.values())
    same_count = len(scores['E0']) == len(scores['coco2017_val']) > 0
    return dict(
        ok=bool(finite and same_count),
        num_detections=len(scores['E0']),
        prior_changes_scores=not torch.equal(
            torch.sort(scores['E0']).values,
            torch.sort(scores['coco2017_val']).values))


def predict_throughput(model, batch, device: str, iters: int) -> float:
    """Images/s of ``predict`` with V' cached (warm-up excluded)."""
    model = copy.deepcopy(model).to(device).eval()
    data = model.data_preprocessor(copy.deepcopy(batch), False)
    with torch.no_grad():
        for _ in range(2):
            model.predict(data['inputs'], copy.deepcopy(data['data_samples']))
        if device == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            model.predict(data['inputs'], copy.deepcopy(data['data_samples']))
        if device == 'cuda':
            torch.cuda.synchronize()
    return iters * len(batch['inputs']) / (time.perf_counter() - start)


def environment() -> dict:
    from mmcv.ops import get_compiling_cuda_version
    info = dict(
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        mmcv_cuda_ops=get_compiling_cuda_version(),
        cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        info['gpu'] = torch.cuda.get_device_name(0)
    return info


def main() -> int:
    args = parse_args()
    start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    results = dict(environment=environment())
    print('environment: ' + ', '.join(
        f'{k}={v}' for k, v in results['environment'].items()))
    cuda = torch.cuda.is_available()
    if not cuda:
        print('CUDA is not available (torch.cuda.is_available() is False): '
              'skipping the CPU-vs-CUDA parity, the CUDA training steps '
              'and the CUDA inference/throughput; running the CPU parts')
    model = build_model(args.seed)
    labels = [[1, 2], [3]] + [[k % 80] for k in range(args.batch_size - 2)]
    batch = demo_batch(labels[:args.batch_size], size=args.size, seed=1)
    checks = {}

    if cuda:
        checks['parity'] = check_parity(model, batch)
    else:
        feats, outs = forward_outputs(model, batch)
        checks['cpu_forward'] = dict(
            ok=bool(all(torch.isfinite(t).all() for t in feats + outs)))
    device = 'cuda' if cuda else 'cpu'
    steps = args.train_steps if cuda else min(args.train_steps, 2)
    checks[f'training_{device}'] = check_training(model, batch, steps, device)
    checks[f'inference_{device}'] = check_inference(model, device, args.size)
    iters = args.iters if cuda else 2
    results['throughput'] = {
        f'predict_{device}_images_per_s':
        predict_throughput(model, batch, device, iters),
        f'train_{device}_images_per_s':
        checks[f'training_{device}']['images_per_s'],
        'batch_size': args.batch_size,
        'size': args.size
    }
    results['checks'] = checks
    results['seconds'] = time.perf_counter() - start

    for name, check in checks.items():
        details = ', '.join(f'{k}={v}' for k, v in check.items() if k != 'ok')
        print(f'{name}: {"ok" if check["ok"] else "FAILED"}'
              + (f' ({details})' if details else ''))
    print('throughput: ' + ', '.join(
        f'{k}={v:.1f}' if isinstance(v, float) else f'{k}={v}'
        for k, v in results['throughput'].items()))
    print(f'total {results["seconds"]:.0f} s')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=2, default=str)
    return 0 if all(c['ok'] for c in checks.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
