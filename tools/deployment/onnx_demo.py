# Copyright (c) mmcalidet contributors. All rights reserved.
"""Detect objects with an exported detector in ONNX Runtime, under a
run-time prior, and draw them (as tools/demo/image_demo.py does).

    python tools/deployment/onnx_demo.py IMG det.onnx --prior shelf.json \\
        --out-dir outputs/onnx_demo
    python tools/deployment/onnx_demo.py IMG det.onnx --prior shelf.json \\
        --compare-prior coco2017_train --out-dir outputs/onnx_demo

``IMG`` is an image or a folder of images; ``det.onnx`` a file of
tools/deployment/export_onnx.py (its metadata names the classes, the input
size and the normalisation: no config is needed). Writes
``vis/<image>`` and ``preds/<image>.json`` under ``--out-dir``; with
``--compare-prior`` also ``compare/<image>.png``, the two priors side by
side. Both priors are checked before ONNX Runtime runs, each read once as
the ``Prior`` that ``set_prior`` takes (a graph with a support input gets
the support the file records); without ``--prior`` the exported deployment
prior applies, with its support. Images are checked
from their header first, as image_demo.py does.
"""
import argparse
import json
import os
import os.path as osp
import warnings

from mmcalidet.utils.cli import positive_int, run_tool, unit_float
from mmcalidet.utils.file_io import check_writable_dir
from mmcalidet.utils.image_files import (MAX_PIXELS, check_images, list_images,
                                         report_written)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Detect objects with an ONNX export under a prior')
    parser.add_argument('img', help='image file or folder of images')
    parser.add_argument('onnx', help='a file of export_onnx.py')
    parser.add_argument(
        '--prior', help='prior file or shipped name (default: the export\'s)')
    parser.add_argument(
        '--compare-prior',
        help='a second prior: also write compare/<image>.png')
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
        help=f'skip images of more pixels than this ({MAX_PIXELS})')
    parser.add_argument(
        '--threads',
        type=positive_int,
        default=None,
        help='ONNX Runtime threads (its default)')
    return parser.parse_args(argv)


def as_data_sample(result: dict, image_path: str):
    """An OnnxDetector result as mmdet's ``DetDataSample``."""
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    sample = DetDataSample(metainfo=dict(img_path=image_path))
    sample.pred_instances = InstanceData(
        bboxes=torch.from_numpy(result['bboxes']),
        scores=torch.from_numpy(result['scores']),
        labels=torch.from_numpy(result['labels']))
    return sample


def main(argv=None) -> int:
    args = parse_args(argv)
    for what, path in (('image', args.img), ('ONNX file', args.onnx)):
        if not osp.exists(path):
            raise ValueError(f'{what} not found: {path}')
    images, skipped = check_images(list_images(args.img), args.max_pixels)
    check_writable_dir(args.out_dir, '--out-dir')

    import mmcv
    from mmdet.visualization import DetLocalVisualizer

    from mmcalidet.apis.inferencer import draw_comparison
    from mmcalidet.apis.prior_comparison import (describe_changes,
                                                 prior_changes, threshold_text)
    from mmcalidet.deploy import OnnxDetector
    detector = OnnxDetector(args.onnx, threads=args.threads)
    # both priors are checked before anything runs, each read once as the
    # Prior set_prior takes: its support travels to a graph that reads it
    # (None: the export's stored prior, its support included)
    priors = [detector.as_prior(args.prior)]
    if args.compare_prior is not None:
        priors.append(detector.as_prior(args.compare_prior))
    classes = detector.classes or [str(k) for k in range(detector.num_classes)]
    visualizer = DetLocalVisualizer(name=f'onnx_demo-{os.getpid()}')
    visualizer.dataset_meta = dict(classes=classes)
    titles = [
        osp.basename(p) if p else 'export\'s prior'
        for p in (args.prior, args.compare_prior)
    ]
    if titles[0] == titles[1]:
        titles = [f'A: {titles[0]}', f'B: {titles[1]}']
    # mmengine's notes on boxes drawn past the image edge
    warnings.filterwarnings('ignore', module='mmengine.visualization')
    for path in images:
        name = osp.basename(path)
        results = [detector(path, prior=p) for p in priors]
        samples = [as_data_sample(r, path) for r in results]
        img = mmcv.imread(path, channel_order='rgb')
        visualizer.add_datasample(
            name,
            img,
            samples[0],
            show=False,
            draw_gt=False,
            pred_score_thr=args.score_thr,
            out_file=osp.join(args.out_dir, 'vis', name))
        os.makedirs(osp.join(args.out_dir, 'preds'), exist_ok=True)
        with open(
                osp.join(args.out_dir, 'preds',
                         osp.splitext(name)[0] + '.json'), 'w') as f:
            json.dump(detector.to_json(results[0]), f)
        num = int((results[0]['scores'] >= args.score_thr).sum())
        line = f'{name}: {num} detections >= ' + threshold_text(
            args.score_thr)
        if len(samples) == 2:
            changes = prior_changes(samples[0], samples[1], classes,
                                    args.score_thr)
            footer = describe_changes(changes, args.score_thr, num)
            canvas = draw_comparison(visualizer, img, name, samples, titles,
                                     footer, args.score_thr)
            mmcv.imwrite(
                canvas[..., ::-1],
                osp.join(args.out_dir, 'compare',
                         osp.splitext(name)[0] + '.png'))
            line += '; under --compare-prior: ' + footer
        print(line, flush=True)
    written = ['vis', 'preds'] + (['compare'] if len(priors) == 2 else [])
    return report_written(args.out_dir, written, len(images), skipped)


if __name__ == '__main__':
    run_tool(main)
