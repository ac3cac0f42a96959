# Copyright (c) mmcalidet contributors. All rights reserved.
"""Does a trained CaliDet use the prior, and with the right sign? Probes
the calibration vectors V' of a checkpoint under E_x, flip(E_x) and E_t of
random label sets, or of the label sets of real images (``--labels``; no
image is run). Example::

    python tools/analysis_tools/prior_sensitivity.py \
        projects/context_shift/configs/calidet_dino_tiny_context-shift.py \
        work_dirs/context_shift/calidet/iter_1000.pth \
        --labels data/context_shift/annotations/instances_val.json

``present_shift``: mean change (vs E0) of a present class's logit on a unit
feature along its own weight; it should be positive under E_x and lower
under flip(E_x). ``relative_change`` near 0 means V' ignores E.
"""
import argparse
import json
import os

from mmcalidet.utils.cli import run_tool


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Sensitivity of a CaliDet checkpoint to its prior')
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument(
        '--num-images',
        type=int,
        default=200,
        help='random label sets (images) to build E_x from')
    parser.add_argument(
        '--objects',
        type=int,
        nargs=2,
        default=[2, 5],
        metavar=('MIN', 'MAX'),
        help='classes per label set')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--labels',
        help='probe the label sets of these images instead of random ones: '
        'a COCO .json, a folder of YOLO .txt files or a .tar.gz of them, '
        "classes matched by name to the model's (every image with a class; "
        '--num-images and --objects are then unused)')
    parser.add_argument(
        '--train-prior',
        help='E_t (default: the prior the checkpoint was saved with)')
    parser.add_argument(
        '--out',
        help='also write the rows as JSON here (and what the libraries '
        'print to OUT.log)')
    parser.add_argument('--device', default='cpu')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    lo, hi = args.objects
    if args.num_images < 1 or not 1 <= lo <= hi:
        raise ValueError('--num-images must be >= 1 and --objects MIN MAX '
                         'must satisfy 1 <= MIN <= MAX')
    import numpy as np

    from mmcalidet.apis import init_detector, is_calibratable
    from mmcalidet.evaluation import markdown_table
    from mmcalidet.evaluation.sensitivity import prior_sensitivity
    from mmcalidet.utils.file_io import atomic_write
    from mmcalidet.utils.log_level import library_output_to

    # mmengine's checkpoint line and warnings: beside the JSON, if any
    with library_output_to(args.out + '.log' if args.out else os.devnull):
        model = init_detector(
            args.config,
            args.checkpoint,
            device=args.device,
            prior=args.train_prior)
    if not is_calibratable(model):
        raise ValueError(f'{args.config} is not a calibratable detector '
                         '(no CaliFormer)')
    k = model.num_classes
    if args.labels:
        labels = image_label_sets(args.labels, model)
    else:
        if hi > k:
            raise ValueError(f'--objects MAX ({hi}) exceeds the {k} classes')
        rng = np.random.default_rng(args.seed)
        labels = [
            rng.choice(k, size=int(rng.integers(lo, hi + 1)), replace=False)
            for _ in range(args.num_images)
        ]
    rows = prior_sensitivity(model.calibrated_head, labels, model.get_prior())
    print(
        markdown_table(rows,
                       [('prior', 'prior', ''), ('num_priors', 'priors', ''),
                        ('relative_change', "change of V' (relative)", '.4f'),
                        ('present_shift', 'present-class shift', '+.4f'),
                        ('absent_shift', 'absent-class shift', '+.4f')]))
    if args.out:
        with atomic_write(args.out) as f:
            json.dump(rows, f, indent=1)
    return 0


def image_label_sets(src: str, model) -> list:
    """The label sets of the images of ``src``, in the model's class order
    (matched by name); :func:`prior_sensitivity` skips those without a
    class.

    Args:
        src (str): a COCO .json, a YOLO folder or a YOLO tarball.
        model: the detector (its classes: ``model_classes``).

    Returns:
        list[np.ndarray]: one array of class indices per image.
    """
    from mmcalidet.priors.dataset_prior import read_label_sets
    from mmcalidet.priors.prior_source import model_classes
    classes = model_classes(model)
    if not classes:
        raise ValueError(f'--labels {src}: the checkpoint and config name '
                         'no classes to match the labels to')
    labels = read_label_sets(src, classes).label_lists()
    if not any(len(lab) for lab in labels):
        raise ValueError(f'--labels {src}: no image has a labelled object')
    return labels


if __name__ == '__main__':
    run_tool(main)
