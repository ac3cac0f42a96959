# Copyright (c) mmcalidet contributors. All rights reserved.
"""Export a DETR-family, one-stage or two-stage detector to ONNX, a CaliDet
one with its prior as an input (or folded into its weights), and check it
against PyTorch.

    python tools/deployment/export_onnx.py CONFIG CHECKPOINT --out det.onnx
    python tools/deployment/export_onnx.py CONFIG CHECKPOINT --out det.onnx \\
        --shape 800 800 --verify
    python tools/deployment/export_onnx.py CONFIG CHECKPOINT \\
        --out shelf.onnx --fold-prior shelf.json --verify

The graph takes ``input`` (1 x 3 x H x W, after the model's normalisation)
and, with ``--prior-input`` (the default for a CaliDet detector), ``prior``
(K x K float32); it returns ``dets`` (N x 5: x1, y1, x2, y2, score, in the
input's pixels) and ``labels`` (N), as mmdeploy's detectors do.
``--fold-prior PRIOR`` computes V' once and folds it into the classifier
weights: the graph then has ``input`` only and the plain detector's cost.
A plain DINO or Deformable DETR exports without a prior.

``--shape`` must be a multiple of the model's ``pad_size_divisor`` (mmdet's
data preprocessor pads its input to one; a graph of another size would not
give PyTorch's detections): another is refused in one line before anything
is built; the default, the config's test scale, is rounded up to one.

``--verify`` runs ONNX Runtime and PyTorch on the same real images (the
first ``--verify-images`` of the config's test set, resized to the graph's
input as ``OnnxDetector`` resizes a user's image) under two priors (the
deployment prior and ``--verify-prior``, E0 by default): boxes and scores
must agree within ``--atol`` and every box must be a decoder query's box
under either prior. At least ``--min-paired`` detections must be paired
with PyTorch's (10): while fewer are, it compares on up to
``EXTRA_IMAGES`` more test images, then on the trace's own input, and
fails if still fewer (a model that detects nothing compared nothing). A
folded graph is compared with the model under the prior it folds, as
``set_prior`` gives it (its support included). A failed check exits with 1
and keeps the file.
"""
import argparse
import contextlib
import io
import os.path as osp
import time
import warnings
from typing import List

from mmengine.config import Config, DictAction

from mmcalidet.utils.cli import (bounded_int, finite_float, positive_int,
                                 run_tool, tool_error)

#: the test images --verify adds while too few detections are paired
EXTRA_IMAGES = 8


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Export a (Cali)DETR to ONNX with its prior as an input')
    parser.add_argument('config', help='config file')
    parser.add_argument(
        'checkpoint', help='checkpoint file (none: random weights)')
    parser.add_argument('--out', required=True, help='the .onnx file')
    parser.add_argument(
        '--shape',
        nargs=2,
        type=bounded_int(32, 4096),
        default=None,
        metavar=('H', 'W'),
        help='input height and width, multiples of the model\'s '
        'pad_size_divisor (default: the config\'s test scale, rounded up '
        'to them)')
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        '--prior-input',
        action='store_true',
        help='the prior is the graph\'s second input (the default for a '
        'CaliDet detector)')
    mode.add_argument(
        '--fold-prior',
        metavar='PRIOR',
        help='fold V\' of this prior (a file or shipped name) into the '
        'classifier weights: no prior input, the plain detector\'s cost')
    parser.add_argument(
        '--verify',
        action='store_true',
        help='compare ONNX Runtime with PyTorch on real images')
    parser.add_argument(
        '--verify-images',
        type=positive_int,
        default=2,
        help='test-set images the check runs on (2)')
    parser.add_argument(
        '--verify-prior',
        default=None,
        help='the second prior of the check (default: E0, the flat prior)')
    parser.add_argument(
        '--min-paired',
        type=positive_int,
        default=10,
        help='fewest detections --verify must pair with PyTorch\'s (10); '
        f'while fewer are, it adds up to {EXTRA_IMAGES} test images, then '
        'the trace\'s own input, then fails')
    parser.add_argument(
        '--atol',
        type=finite_float(0.0),
        default=1e-4,
        help='largest box (pixels) or score difference (1e-4)')
    parser.add_argument(
        '--opset', type=bounded_int(16, 21), default=17, help='opset (17)')
    parser.add_argument('--device', default='cpu', help='export on (cpu)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries')
    return parser.parse_args(argv)


def test_scale(cfg: Config) -> List[int]:
    """``[H, W]`` of the config's test ``Resize`` (its ``scale`` is
    ``(W, H)``)."""
    pipeline = cfg.test_dataloader.dataset.get('pipeline') or []
    for step in pipeline:
        if step.get('type') == 'Resize' and step.get('scale'):
            width, height = step['scale']
            return [int(height), int(width)]
    raise ValueError('the config\'s test pipeline has no Resize scale: '
                     'give --shape H W')


def export_shape(cfg: Config, shape) -> List[int]:
    """``[H, W]`` to export at: ``--shape``, which the model's
    ``pad_size_divisor`` must divide, or the config's test scale rounded
    up to its multiples (as mmdet pads).

    Raises:
        ValueError: a ``--shape`` that is not such a multiple, in one line.
    """
    preprocessor = cfg.model.get('data_preprocessor') or {}
    divisor = max(int(preprocessor.get('pad_size_divisor', 1) or 1), 1)
    if shape is None:
        scale = test_scale(cfg)
        shape = [-(-v // divisor) * divisor for v in scale]
        if shape != scale:
            print(f'the test scale {scale[0]} x {scale[1]} rounded up to '
                  f'{shape[0]} x {shape[1]}, multiples of the model\'s '
                  f'pad_size_divisor {divisor}')
        return shape
    if shape[0] % divisor or shape[1] % divisor:
        good = [-(-v // divisor) * divisor for v in shape]
        raise ValueError(
            f'--shape {shape[0]} {shape[1]}: the model\'s data_preprocessor '
            f'pads its input to multiples of {divisor} (pad_size_divisor), '
            'so a graph of this size would not give PyTorch\'s detections; '
            f'give --shape {good[0]} {good[1]}')
    return list(shape)


def test_images(cfg: Config, num: int) -> List[str]:
    """The first ``num`` image files of the config's test set (fewer if it
    has fewer)."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' index
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    if len(dataset) == 0:
        raise ValueError('the config\'s test set is empty: nothing to '
                         'verify on')
    return [
        dataset.get_data_info(i)['img_path']
        for i in range(min(num, len(dataset)))
    ]


def load_models(cfg: Config, args: argparse.Namespace) -> tuple:
    """The model to export, the model ``--verify`` compares with and the
    verification's second prior; every prior is checked before the export
    runs, its support included.

    Returns:
        tuple: ``(model, reference, second)``: a ``--fold-prior`` export's
        model is the folded copy and its reference the model under that
        prior, as ``set_prior`` gives it (its support included); the second
        prior is ``--verify-prior`` (E0 by default), ``None`` when the graph
        takes no prior.
    """
    from mmcalidet.apis import init_detector
    from mmcalidet.deploy import fold_prior
    from mmcalidet.priors import flat_prior
    from mmcalidet.utils.log_level import mmengine_log_level
    from mmcalidet.utils.model_heads import classifying_head
    with mmengine_log_level(at_least=40), warnings.catch_warnings():
        warnings.simplefilter('ignore')  # mmdet's notes on class names
        model = init_detector(
            cfg,
            None if args.checkpoint == 'none' else args.checkpoint,
            device=args.device)
    calibratable = hasattr(model, 'resolve_prior')
    if (args.prior_input or args.fold_prior) and not calibratable:
        raise ValueError(f'{type(model).__name__} takes no prior: export it '
                         'without --prior-input / --fold-prior')
    if args.fold_prior is not None:
        folded_prior = model.resolve(args.fold_prior)
        folded = fold_prior(model, folded_prior)
        model.set_prior(folded_prior)
        return folded, model, None
    second = None
    if calibratable:
        second = model.resolve(args.verify_prior) \
            if args.verify_prior else flat_prior(
                classifying_head(model).num_classes)
    return model, model, second


def main(argv=None) -> int:
    args = parse_args(argv)
    for what, path in (('config', args.config), ('checkpoint',
                                                 args.checkpoint)):
        if not (what == 'checkpoint' and path == 'none') and \
                not osp.isfile(path):
            raise ValueError(f'{what} not found: {path}')
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise tool_error(f'{exc.name} is not installed: pip install -e '
                         '".[deploy]" (onnx, onnxruntime)') from None
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    shape = export_shape(cfg, args.shape)

    model, reference, second = load_models(cfg, args)
    prior_input = hasattr(model, 'resolve_prior') and args.fold_prior is None
    from mmcalidet.deploy import export_onnx, verify_onnx
    kind = 'prior input' if prior_input else (
        f'prior {args.fold_prior} folded' if args.fold_prior else 'no prior')
    print(
        f'exporting {type(model).__name__} ({kind}), input 1 x 3 x '
        f'{shape[0]} x {shape[1]} ...',
        flush=True)
    start = time.perf_counter()
    export_onnx(
        model,
        args.out,
        tuple(shape),
        prior_input=prior_input,
        opset=args.opset)
    print(
        f'wrote {args.out} ({osp.getsize(args.out) / 2**20:.1f} MB, '
        f'{time.perf_counter() - start:.1f} s)',
        flush=True)
    if not args.verify:
        return 0
    found = test_images(cfg, args.verify_images + EXTRA_IMAGES)
    images, extra = found[:args.verify_images], found[args.verify_images:]
    priors = [None, second] if prior_input else [None]
    print(
        f'verifying on {len(images)} test image(s) under {len(priors)} '
        'prior(s) ...',
        flush=True)
    report = verify_onnx(
        args.out,
        reference,
        images,
        priors,
        atol=args.atol,
        min_paired=args.min_paired,
        fallback=extra)
    print(f'  {report["paired"]} detection(s) paired with PyTorch\'s on '
          f'{report["images"]} input(s)' +
          (f' ({report["retried"]} added while fewer than '
           f'{args.min_paired} were paired)' if report['retried'] else ''))
    if 'rois' in report:
        print(f'  RoIs: {report["rois_paired"]} of {sum(report["rois"])} '
              'paired (same box for every class)')
    print(f'  boxes: max |ONNX - PyTorch| {report["max_box_diff"]:.2e} px; '
          f'scores: {report["max_score_diff"]:.2e}; labels equal: '
          f'{report["labels_equal"]}')
    if prior_input:
        print(f'  the priors moved scores by up to '
              f'{report["score_shift"]:.2e} and no box: '
              f'{report["boxes_fixed"]}')
    if not report['ok']:
        raise tool_error('verification failed: ' +
                         '; '.join(report['failures']) + f' ({args.out} kept)')
    print('verified: ONNX Runtime agrees with PyTorch '
          f'({report["paired"]} detections paired)')
    return 0


if __name__ == '__main__':
    run_tool(main)
