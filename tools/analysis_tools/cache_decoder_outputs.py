# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cache a trained detector's decoder outputs over its training set, for
calibrator training (``DecoderCacheDataset``).

    python tools/analysis_tools/cache_decoder_outputs.py \
        configs/context_shift/dino_tiny_context-shift.py \
        work_dirs/context_shift/dino/iter_3000.pth \
        --out work_dirs/context_shift/dino/decoder_cache_train

A calibrator config whose dataset has a ``source`` makes the cache itself
on first use; this tool makes it ahead (e.g. on a GPU machine, or with more
augmented passes) and says how large it is.
"""
import argparse
import os
import os.path as osp
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmcalidet.utils.cli import run_tool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Cache every decoder layer\'s hidden states and boxes '
        'of a trained detector over its training set')
    parser.add_argument('config', help='the detector\'s config')
    parser.add_argument('checkpoint', help='its trained checkpoint')
    parser.add_argument('--out', required=True, help='the cache folder')
    parser.add_argument(
        '--passes',
        type=int,
        default=1,
        help='passes over the training set (other augmentations each)')
    parser.add_argument(
        '--num-images',
        type=int,
        help='cache only the first N training images')
    parser.add_argument(
        '--dtype',
        choices=('float32', 'float16'),
        default='float32',
        help='storage type of the hidden states')
    parser.add_argument(
        '--batch-size', type=int, default=8, help='images per forward')
    parser.add_argument('--device', default='cpu', help='e.g. cuda:0')
    parser.add_argument(
        '--force', action='store_true', help='remake an up-to-date cache')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bar')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmcalidet.datasets.decoder_cache import (build_decoder_cache,
                                                  read_cache_meta,
                                                  stale_message, stale_reasons)
    indices = list(range(args.num_images)) if args.num_images else None
    if not args.force:
        reasons = stale_reasons(args.out, args.config, args.checkpoint,
                                args.passes, indices, args.dtype)
        if not reasons:
            print(f'{args.out} is up to date (--force to remake it)')
            return 0
        message = stale_message(args.out, reasons)
        if message:
            print(message)
    start = time.perf_counter()
    build_decoder_cache(
        args.config,
        args.checkpoint,
        args.out,
        passes=args.passes,
        indices=indices,
        batch_size=args.batch_size,
        dtype=args.dtype,
        device=args.device,
        progress=not args.no_progress)
    meta = read_cache_meta(args.out)
    size = sum(
        osp.getsize(osp.join(args.out, f)) for f in os.listdir(args.out))
    print(f'cached {meta["num_entries"]} entries x {meta["num_layers"]} '
          f'decoder layers to {args.out} ({size / 2**20:.1f} MiB, '
          f'{time.perf_counter() - start:.0f} s)')
    return 0


if __name__ == '__main__':
    run_tool(main)
