# Copyright (c) mmcalidet contributors. All rights reserved.
"""Convert YOLO labels (+ images or a sizes JSON) to a COCO annotation file
with the real COCO category ids and names. Example::

    python tools/dataset_converters/yolo2coco.py \
        ../shared/datasets/coco-mini/labels/val2017 \
        --images ../shared/datasets/coco-mini/images/val2017 \
        --classes ../shared/datasets/coco2017-labels/classes.json \
        --out data/coco-mini/annotations/instances_val2017.json
"""
import argparse
import json
import os

# priors only: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.datasets.yolo_to_coco import (image_sizes_from_folder,
                                             labelled_sizes, read_categories,
                                             read_sizes_json, yolo_to_coco)
from mmcalidet.utils.cli import run_tool
from mmcalidet.utils.file_io import atomic_write


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='YOLO labels -> COCO annotation file')
    parser.add_argument('labels', help='folder of YOLO label files')
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument('--images', help='folder of the images (sizes are '
                       'read from their headers)')
    group.add_argument(
        '--sizes',
        help='JSON {"file name": [width, height]}; only its images with a '
        'label file are written (see --keep-unlabelled)')
    parser.add_argument(
        '--keep-unlabelled',
        action='store_true',
        help='with --sizes: also write the images without a label file (as '
        'images without objects), e.g. the 48 of val2017 when converting '
        'the whole split')
    parser.add_argument('--classes', required=True,
                        help='classes file; coco2017-labels/classes.json '
                        'keeps the real COCO category ids')
    parser.add_argument('--out', required=True, help='annotation file')
    parser.add_argument('--allow-orphans', action='store_true',
                        help='skip label files that have no image')
    args = parser.parse_args(argv)
    if args.keep_unlabelled and not args.sizes:
        parser.error('--keep-unlabelled needs --sizes (with --images every '
                     'image of the folder is written)')
    return args


def main(argv=None):
    args = parse_args(argv)
    categories = read_categories(args.classes)
    if args.images:
        sizes = image_sizes_from_folder(args.images)
    else:
        sizes = read_sizes_json(args.sizes)
        if not args.keep_unlabelled:
            sizes = labelled_sizes(sizes, args.labels)
    coco = yolo_to_coco(args.labels, sizes, categories,
                        strict=not args.allow_orphans)
    with atomic_write(args.out, 'w', encoding='utf-8') as f:
        json.dump(coco, f, allow_nan=False)
    print(f'wrote {args.out}: {len(coco["images"])} images, '
          f'{len(coco["annotations"])} annotations, '
          f'{len(coco["categories"])} categories')
    return 0


if __name__ == '__main__':
    run_tool(main)
