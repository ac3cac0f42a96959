# Copyright (c) mmcalidet contributors. All rights reserved.
"""Detect objects in images under a deployment prior and draw them.

    python tools/demo/image_demo.py IMG CONFIG CHECKPOINT \\
        --prior site.json --out-dir outputs/demo
    python tools/demo/image_demo.py IMG CONFIG CHECKPOINT \\
        --prior site.json --compare-prior coco2017_train --out-dir out

``IMG`` is an image or a folder of images. Writes, under ``--out-dir``,
``vis/<image>`` (the detections under ``--prior``, drawn by mmdet's
``DetLocalVisualizer``) and ``preds/<image>.json``; with
``--compare-prior`` also ``compare/<image>.png``: the same image under the
two priors side by side, with the classes whose number of detections
changed. A prior is a prior file (``.json`` keyed by class names, see
``tools/misc/edit_prior.py``, or ``.npy``) or a shipped name such as
``coco2017_val``; without ``--prior`` the checkpoint's prior is used. Both
priors are checked before the model runs; a bad one is an error.

Every image is checked before the model runs, from its header alone: a
file that is not an image, or one of more than ``--max-pixels`` pixels
(which would be decoded whole, e.g. 20000 x 20000 takes over 1 GB), is
skipped with a line naming it; the others are still run, and the tool then
exits with 1. A folder without images is an error.
"""
import argparse
import os.path as osp

from mmengine.config import Config, DictAction

from mmcalidet.utils.cli import positive_int, run_tool, unit_float
from mmcalidet.utils.file_io import check_writable_dir
from mmcalidet.utils.image_files import (MAX_PIXELS, check_images, list_images,
                                         report_written)
from mmcalidet.utils.validation import check_device


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Detect objects under a deployment prior and draw them')
    parser.add_argument('img', help='image file or folder of images')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--prior',
        help='prior file or shipped name (default: the checkpoint\'s)')
    parser.add_argument(
        '--compare-prior',
        help='a second prior: also write compare/<image>.png, the '
        'detections under --prior and under this one side by side')
    parser.add_argument(
        '--out-dir', default='outputs', help='output folder (outputs)')
    parser.add_argument(
        '--score-thr',
        type=unit_float,
        default=0.3,
        help='draw and count detections at or above this score (0.3)')
    parser.add_argument(
        '--max-pixels',
        type=positive_int,
        default=MAX_PIXELS,
        help='skip images of more pixels than this, read from their header '
        f'before decoding ({MAX_PIXELS}, as Pillow\'s)')
    parser.add_argument(
        '--device', default=None, help='e.g. cpu, cuda:0 (default: auto)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. '
        'test_dataloader.dataset.pipeline.1.scale="(512,512)"')
    return parser.parse_args(argv)


def prior_title(prior) -> str:
    """A panel title for a prior argument."""
    return 'checkpoint prior' if prior is None else osp.basename(prior)


def main(argv=None) -> int:
    args = parse_args(argv)
    for what, path in (('image', args.img), ('config', args.config),
                       ('checkpoint', args.checkpoint)):
        if not osp.exists(path):
            raise ValueError(f'{what} not found: {path}')
    images, skipped = check_images(list_images(args.img), args.max_pixels)
    check_writable_dir(args.out_dir, '--out-dir')
    check_device(args.device, '--device')

    from mmcalidet.apis import CaliDetInferencer
    from mmcalidet.apis.prior_comparison import (describe_changes,
                                                 threshold_text)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    inferencer = CaliDetInferencer(
        cfg, args.checkpoint, device=args.device, show_progress=False)
    if args.compare_prior is None:
        result = inferencer(
            images,
            prior=args.prior,
            out_dir=args.out_dir,
            pred_score_thr=args.score_thr,
            return_datasamples=True)
        preds = result['predictions']
    else:
        titles = [prior_title(args.prior), prior_title(args.compare_prior)]
        if titles[0] == titles[1]:
            titles = [f'A: {titles[0]}', f'B: {titles[1]}']
        result = inferencer.compare_priors(
            images,
            args.prior,
            args.compare_prior,
            titles=titles,
            pred_score_thr=args.score_thr,
            out_dir=args.out_dir)
        preds = [first for first, _ in result['predictions']]
        inferencer.visualize(
            result['inputs'],
            preds,
            pred_score_thr=args.score_thr,
            img_out_dir=args.out_dir)
    inferencer.postprocess(preds, pred_out_dir=args.out_dir)

    for k, pred in enumerate(preds):
        name = osp.basename(pred.metainfo.get('img_path') or f'{k:08d}.jpg')
        num = int((pred.pred_instances.scores >= args.score_thr).sum())
        line = f'{name}: {num} detections >= ' + threshold_text(
            args.score_thr)
        if args.compare_prior is not None:
            line += '; under --compare-prior: ' + describe_changes(
                result['changes'][k], args.score_thr, num)
        print(line)
    written = ['vis', 'preds'] + (['compare'] if args.compare_prior else [])
    return report_written(args.out_dir, written, len(images), skipped)


if __name__ == '__main__':
    run_tool(main)
