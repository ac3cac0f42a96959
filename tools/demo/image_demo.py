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
import os
import os.path as osp
import sys
import warnings
from typing import List, Optional, Tuple

from mmengine.config import Config, DictAction

from mmcalidet.utils.cli import error_line, positive_int, run_tool, unit_float

#: the file names read in a folder (mmdet's ``DetInferencer``'s)
IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif',
                  '.tiff', '.webp')
#: the default pixel limit, Pillow's ``Image.MAX_IMAGE_PIXELS``
MAX_PIXELS = 89_478_485


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


def list_images(img: str) -> List[str]:
    """The image files of ``IMG``: itself, or a folder's files with an image
    extension, sorted.

    Args:
        img (str): an image file or a folder.

    Returns:
        list[str]: the files.

    Raises:
        ValueError: a folder without image files.
    """
    if not osp.isdir(img):
        return [img]
    files = sorted(
        osp.join(img, name) for name in os.listdir(img)
        if name.lower().endswith(IMG_EXTENSIONS)
        and osp.isfile(osp.join(img, name)))
    if not files:
        raise ValueError(f'no images ({", ".join(IMG_EXTENSIONS)}) found in '
                         f'{img}: nothing written')
    return files


def check_image(path: str, max_pixels: int) -> Optional[str]:
    """Why an image file cannot be run, from its header alone (nothing is
    decoded), or ``None`` if it can.

    Args:
        path (str): the image file.
        max_pixels (int): the largest width x height accepted.

    Returns:
        str | None: the reason, or ``None``.
    """
    from PIL import Image, UnidentifiedImageError
    limit = Image.MAX_IMAGE_PIXELS
    try:
        # Pillow's own bomb guard would refuse at a limit of its own; the
        # size is checked here against --max-pixels instead
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > max_pixels:
                    return (f'{width} x {height} = {width * height} pixels, '
                            f'over --max-pixels {max_pixels}')
                image.verify()  # the file's structure, without decoding
    except UnidentifiedImageError:
        return 'not an image (or of a format Pillow cannot read)'
    except (OSError, SyntaxError, ValueError) as exc:
        # unreadable, or a broken image (Pillow's verify raises these)
        return f'unreadable image ({exc})'
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if width < 1 or height < 1:
        return f'empty image ({width} x {height})'
    return None


def check_images(files: List[str], max_pixels: int) -> Tuple[List[str], int]:
    """The files that can be run; a line on stderr names each other one.

    Args:
        files (list[str]): the image files.
        max_pixels (int): the largest width x height accepted.

    Returns:
        tuple[list[str], int]: the good files and the number skipped.

    Raises:
        ValueError: none of the files can be run.
    """
    good = []
    for path in files:
        reason = check_image(path, max_pixels)
        if reason is None:
            good.append(path)
        else:
            print(error_line(f'skipped {path}: {reason}'), file=sys.stderr)
    if not good:
        raise ValueError(f'none of the {len(files)} image(s) could be run: '
                         'nothing written')
    return good, len(files) - len(good)


def main(argv=None) -> int:
    args = parse_args(argv)
    for what, path in (('image', args.img), ('config', args.config),
                       ('checkpoint', args.checkpoint)):
        if not osp.exists(path):
            raise ValueError(f'{what} not found: {path}')
    images, skipped = check_images(list_images(args.img), args.max_pixels)

    from mmcalidet.apis import CaliDetInferencer
    from mmcalidet.apis.inferencer import describe_changes
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
        line = f'{name}: {num} detections >= {args.score_thr:.2f}'
        if args.compare_prior is not None:
            line += '; under --compare-prior: ' + describe_changes(
                result['changes'][k], args.score_thr)
        print(line)
    written = ['vis', 'preds'] + (['compare'] if args.compare_prior else [])
    print('wrote ' + ', '.join(osp.join(args.out_dir, d) for d in written))
    if skipped:
        print(
            error_line(f'{skipped} of {len(images) + skipped} image(s) '
                       'skipped (named above)'),
            file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    run_tool(main)
