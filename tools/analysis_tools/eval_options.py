# Copyright (c) mmcalidet contributors. All rights reserved.
"""The command-line options shared by the evaluation tools
(``eval_priors.py``, ``eval_subsets.py``, ``self_calibrate.py``,
``fit_site_prior.py`` beside this file): parsed here, passed to
:class:`~mmcalidet.evaluation.EvalSetup` as plain arguments, so the library
holds no argparse. A tool imports it after putting its own folder on
``sys.path`` (tools run as scripts and through ``runpy``)::

    sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
    from eval_options import add_model_args, ensure_out_dir, eval_setup
"""
import argparse
import contextlib
import os
import os.path as osp
from typing import Iterator

import torch
from mmengine.config import DictAction

from mmcalidet.evaluation.baselines import CORRECTIONS
from mmcalidet.utils.cli import finite_float, non_negative_int, positive_int
from mmcalidet.utils.file_io import check_writable_dir


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add the options shared by the evaluation tools.

    Args:
        parser (argparse.ArgumentParser): a tool's parser.
    """
    parser.add_argument(
        '--baseline-config',
        help='config of a plain detector (e.g. DINO) to compare with')
    parser.add_argument(
        '--baseline-checkpoint', help='checkpoint of the plain detector')
    parser.add_argument(
        '--posthoc',
        nargs='*',
        choices=CORRECTIONS,
        default=None,
        help='post-hoc prior corrections of the plain detector (default '
        'both when a baseline is given)')
    parser.add_argument(
        '--cooc-beta',
        type=finite_float(),
        default=1.0,
        help='strength of the co-occurrence rescoring')
    parser.add_argument(
        '--train-prior',
        help='E_t (prior file or shipped name); default the config\'s '
        '`prior`, else the checkpoint\'s deployment prior')
    parser.add_argument(
        '--max-images',
        type=positive_int,
        help='evaluate only the first N images of the test set')
    parser.add_argument(
        '--batch-size',
        type=positive_int,
        help='evaluation batch size (the E_b batches); default the '
        'config\'s test_dataloader.batch_size')
    parser.add_argument(
        '--rescore-batch-size',
        type=positive_int,
        default=64,
        help='images per re-scoring step')
    parser.add_argument(
        '--cache-dir',
        help='keep the decoder caches in this folder instead of memory, '
        'one sub-folder per checkpoint, config and test images: a later '
        'run with the same ones reuses it and skips the detector\'s pass')
    parser.add_argument(
        '--cache-dtype',
        choices=['float32', 'float16'],
        default='float32',
        help='cache storage (float16: half the memory, approximate)')
    parser.add_argument(
        '--eval-workers',
        type=non_negative_int,
        default=0,
        help='COCO evaluations in parallel processes (eval_priors.py)')
    parser.add_argument(
        '--device',
        default='cuda' if torch.cuda.is_available() else 'cpu',
        help='device (default cuda when available)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        metavar='KEY=VALUE',
        help='override entries of both configs')
    parser.add_argument(
        '--out-dir', default='work_dirs/eval', help='where to write results')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bars')


def eval_setup(args: argparse.Namespace):
    """The :class:`~mmcalidet.evaluation.EvalSetup` of the parsed options.

    What the libraries print while the detectors load and run (pycocotools'
    index, mmengine's checkpoint lines, warnings) is appended to
    ``<out_dir>/eval.log``; the console keeps the progress bars and the
    stage lines.

    Args:
        args (argparse.Namespace): options of :func:`add_model_args` plus
            ``config`` and ``checkpoint``.

    Returns:
        EvalSetup: the detectors, their caches and the methods.
    """
    from mmcalidet.evaluation.methods import EvalSetup
    from mmcalidet.utils.log_level import library_output_to
    log_file = osp.join(ensure_out_dir(args.out_dir), 'eval.log')
    with library_output_to(log_file) as console:
        return EvalSetup(
            args.config,
            args.checkpoint,
            baseline_config=args.baseline_config,
            baseline_checkpoint=args.baseline_checkpoint,
            posthoc=args.posthoc,
            cooc_beta=args.cooc_beta,
            train_prior=args.train_prior,
            max_images=args.max_images,
            batch_size=args.batch_size,
            rescore_batch_size=args.rescore_batch_size,
            cache_dir=args.cache_dir,
            cache_dtype=args.cache_dtype,
            device=args.device,
            cfg_options=args.cfg_options,
            progress=not args.no_progress,
            report=lambda line: print(line, file=console, flush=True))


def check_out_dir(path: str) -> str:
    """Refuse, before any work, an ``--out-dir`` that is a file or cannot
    be made or written (:func:`~mmcalidet.utils.file_io.
    check_writable_dir`); nothing is made.

    Args:
        path (str): the folder.

    Returns:
        str: ``path``.

    Raises:
        ValueError: one line naming ``--out-dir`` and the problem.
    """
    return check_writable_dir(path, '--out-dir')


def ensure_out_dir(path: str) -> str:
    """Create the output folder (checked by :func:`check_out_dir` first).

    Args:
        path (str): the folder.

    Returns:
        str: ``path``.
    """
    check_out_dir(path)
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def nothing_left_on_failure(out_dir: str) -> Iterator[None]:
    """Inside the block, a failure (any exception, Ctrl-C included)
    removes what the run wrote to ``out_dir``: the files it made there
    (``eval.log``, the report), ``eval.log`` cut back to the size it had,
    and the folders it made (``out_dir`` and missing parents such as
    ``./work_dirs``), where empty.

    Args:
        out_dir (str): the output folder.

    Yields:
        None
    """
    out_dir = osp.abspath(out_dir)
    top = None  # the outermost folder the run will make
    folder = out_dir
    while not osp.isdir(folder) and osp.dirname(folder) != folder:
        top, folder = folder, osp.dirname(folder)
    before = set() if top else set(os.listdir(out_dir))
    log = osp.join(out_dir, 'eval.log')
    log_size = osp.getsize(log) if osp.isfile(log) else None
    try:
        yield
    except BaseException:
        if osp.isdir(out_dir):
            for name in set(os.listdir(out_dir)) - before:
                path = osp.join(out_dir, name)
                if osp.isfile(path) or osp.islink(path):
                    os.remove(path)
            if log_size is not None and osp.isfile(log):
                with open(log, 'r+b') as f:
                    f.truncate(log_size)
        folder = out_dir
        while top is not None and osp.isdir(folder) and \
                not os.listdir(folder):
            os.rmdir(folder)
            if folder == top:
                break
            folder = osp.dirname(folder)
        raise
