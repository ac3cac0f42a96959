# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cache a trained detector's decoder outputs over its training set, for
calibrator training (``DecoderCacheDataset``), or check a cache folder.

    python tools/analysis_tools/cache_decoder_outputs.py \
        configs/calidet/dino_tiny_coco-mini.py \
        work_dirs/dino_tiny_coco-mini/iter_400.pth \
        --out work_dirs/dino_tiny_coco-mini/decoder_cache_train --passes 2

    python tools/analysis_tools/cache_decoder_outputs.py --check \
        work_dirs/dino_tiny_coco-mini/decoder_cache_train

A one-stage detector (RTMDet) gets a dense head's cache: the features and
targets of its positive and sampled negative locations, ``--num-locations``
per image (its config's ``source.num_locations``). A two-stage detector
(Faster R-CNN) gets a box head's cache: the classification features and
targets of the RoIs its training sampler draws, padded to
``--num-locations`` per image (default the sampler's ``num``).

A calibrator config whose dataset has a ``source`` makes the cache itself
on first use; this tool makes it ahead (e.g. on a GPU machine, or with more
augmented passes) and says how large it is. A current cache (same config,
checkpoint and settings, every file complete) is kept; a stale or torn one
is made again, saying why.
"""
import argparse
import os
import os.path as osp
import time

from mmcalidet.utils.cli import positive_int, run_tool, seed_int
from mmcalidet.utils.file_io import check_writable_dir, check_writable_file


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Cache every decoder layer\'s hidden states and boxes '
        'of a trained detector over its training set, or check a cache')
    parser.add_argument('config', nargs='?', help='the detector\'s config')
    parser.add_argument('checkpoint', nargs='?', help='its trained checkpoint')
    parser.add_argument(
        '--out',
        help='the cache folder (what the libraries print goes to '
        'OUT.log)')
    parser.add_argument(
        '--check',
        metavar='DIR',
        help='only validate the cache folder DIR (every file against its '
        'meta.json, every stored value finite) and describe it')
    parser.add_argument(
        '--passes',
        type=positive_int,
        default=1,
        help='passes over the training set (other augmentations each)')
    parser.add_argument(
        '--num-images',
        type=positive_int,
        help='cache only the first N (>= 1) training images')
    parser.add_argument(
        '--dtype',
        choices=('float32', 'float16'),
        default='float32',
        help='storage type of the hidden states')
    parser.add_argument(
        '--layers',
        choices=('all', 'last'),
        default='all',
        help='decoder layers kept (calibrator training reads all)')
    parser.add_argument(
        '--seed', type=seed_int, help='random seed of the augmentations')
    parser.add_argument(
        '--batch-size',
        type=positive_int,
        default=8,
        help='images per forward')
    parser.add_argument(
        '--num-locations',
        type=positive_int,
        help='a one-stage detector\'s cached locations per image (default '
        '1024)')
    parser.add_argument('--device', default='cpu', help='e.g. cuda:0')
    parser.add_argument(
        '--force', action='store_true', help='remake an up-to-date cache')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bar')
    args = parser.parse_args(argv)
    if args.check is None and not (args.config and args.checkpoint
                                   and args.out):
        parser.error('give CONFIG CHECKPOINT --out DIR, or --check DIR')
    return args


def describe(cache) -> str:
    """One line: entries, layers, size and folder of a cache."""
    size = sum(
        osp.getsize(osp.join(cache.folder, f))
        for f in os.listdir(cache.folder))
    what = dict(
        dense=f'{cache.num_queries} locations of a dense head',
        roi=f'{cache.num_queries} RoIs of a box head').get(
            cache.meta.get('head'), f'{cache.num_layers} decoder layers')
    return (f'{len(cache)} entries x {what} in '
            f'{cache.folder} ({size / 2**20:.1f} MiB)')


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmcalidet.decoder_cache import DecoderCache, ensure_decoder_cache
    if args.check is not None:
        cache = DecoderCache.open(args.check).check_values()
        print(f'valid: {describe(cache)}')
        return 0
    from mmcalidet.utils.log_level import library_output_to

    # the cache folder and its log, checked before the detector pass
    check_writable_dir(args.out, '--out')
    check_writable_file(osp.normpath(args.out) + '.log', '--out\'s log')
    start = time.perf_counter()
    # pycocotools' index, mmengine's checkpoint line and warnings: beside
    # the cache, not on the console
    with library_output_to(osp.normpath(args.out) + '.log') as console:
        cache, made = ensure_decoder_cache(
            args.out,
            args.config,
            args.checkpoint,
            passes=args.passes,
            indices=list(range(args.num_images)) if args.num_images else None,
            batch_size=args.batch_size,
            dtype=args.dtype,
            device=args.device,
            progress=not args.no_progress,
            seed=args.seed,
            layers=args.layers,
            num_locations=args.num_locations,
            force=args.force,
            logger=lambda line: print(line, file=console, flush=True))
    if not made:
        print(f'{args.out} is up to date (--force to remake it)')
        return 0
    print(f'cached {describe(cache)}, '
          f'{time.perf_counter() - start:.0f} s')
    return 0


if __name__ == '__main__':
    run_tool(main)
