# Copyright (c) mmcalidet contributors. All rights reserved.
"""Evaluate a checkpoint with mmengine's Runner, optionally with a prior.

    python tools/test.py <config> <checkpoint> [--prior coco2017_val] \
        [--show-dir vis] [--show --wait-time 2]

A CaliDet checkpoint carries its deployment prior; ``--prior`` injects
another one (a prior file or a shipped name) after loading. A checkpoint
that does not fit the config (another class count, a plain detector's
checkpoint with a CaliDet config, missing tensors) is an error naming what
does not fit. ``--out`` replaces its file only when the run succeeds.
``--show`` / ``--show-dir`` / ``--wait-time`` turn on the config's
visualization hook as mmdet's tools/test.py does (the drawn predictions are
under the deployment prior, or the injected one).
"""
import argparse
import os
import os.path as osp

from mmdet.engine.hooks.utils import trigger_visualization_hook
from mmengine.config import Config, DictAction
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmcalidet  # noqa: F401  (registers the modules and checkpoint types)
import mmcalidet.engine.checkpoint_hooks  # noqa: F401  (registers hooks)
from mmcalidet.apis import is_calibratable
from mmcalidet.utils.checkpoint import (check_checkpoint_readable,
                                        name_checkpoint)
from mmcalidet.utils.checkpoint_compat import CheckpointError
from mmcalidet.utils.cli import run_tool, tool_error
from mmcalidet.utils.config_text import cache_config_formatting
from mmcalidet.utils.cpu_dist import init_cpu_distributed


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where to save the metrics')
    parser.add_argument(
        '--prior',
        help='deployment prior to inject (prior file or shipped name)')
    parser.add_argument(
        '--out', help='dump the predictions to this pickle file')
    parser.add_argument(
        '--show', action='store_true', help='show prediction results')
    parser.add_argument(
        '--show-dir',
        help='directory where painted images will be saved; relative to '
        'WORK_DIR/TIMESTAMP (mmdet\'s DetVisualizationHook)')
    parser.add_argument(
        '--wait-time', type=float, default=2, help='the interval of show (s)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. test_dataloader.batch_size=1')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        parser.error('--out must be a .pkl file')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    cache_config_formatting()  # mmengine formats the config 3+ times
    if '://' not in args.checkpoint:
        # a missing, empty or non-regular local checkpoint fails here, in
        # one line, before the datasets and the model are built (the
        # runner's load reports a corrupt one)
        check_checkpoint_readable(args.checkpoint)
    if args.prior is not None:
        # a bad prior file is refused before the runner makes work_dir
        from mmcalidet.priors.prior import Prior
        try:
            Prior.load(args.prior)
        except ValueError as exc:
            raise tool_error(f'--prior: {exc}')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        try:
            cfg = trigger_visualization_hook(cfg, args)
        except RuntimeError as exc:
            raise tool_error(f'--show/--show-dir: {exc}')
    # evaluating weights that do not fit the config is an error
    cfg.custom_hooks = [
        h for h in cfg.get('custom_hooks', None) or []
        if h.get('type') != 'CheckpointCompatHook'
    ] + [
        dict(
            type='CheckpointCompatHook',
            allow_uncalibrated=False,
            allow_missing=False)
    ]
    tmp_out = None
    if args.out is not None:
        # written beside --out and renamed onto it once the run succeeded
        out = osp.abspath(args.out)
        tmp_out = osp.join(
            osp.dirname(out), f'.{osp.basename(out)}.{os.getpid()}.tmp.pkl')
        cfg.test_evaluator = [
            *(cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else
              [cfg.test_evaluator]),
            dict(type='DumpDetResults', out_file_path=tmp_out)
        ]

    init_cpu_distributed(cfg)

    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg \
        else RUNNERS.build(cfg)
    try:
        if args.prior is not None:
            runner.load_or_resume()  # the checkpoint's prior, then the new
            model = getattr(runner.model, 'module', runner.model)
            if not is_calibratable(model):
                raise tool_error('--prior needs a calibratable detector, '
                                 f'got {type(model).__name__}')
            try:
                model.set_prior(args.prior)
            except ValueError as exc:
                raise tool_error(f'--prior: {exc}')
        runner.test()
        if tmp_out is not None and is_main_process():
            os.replace(tmp_out, args.out)
            # mmdet's dump logged the temporary name
            runner.logger.info(f'results renamed to {args.out}')
    except CheckpointError as exc:
        raise name_checkpoint(exc, args.checkpoint) from exc
    finally:
        if tmp_out is not None and osp.exists(tmp_out):
            os.remove(tmp_out)


if __name__ == '__main__':
    # a bad checkpoint (unreadable, not fitting, invalid prior): one line
    run_tool(main, errors=(CheckpointError, ))
