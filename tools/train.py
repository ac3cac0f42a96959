# Copyright (c) mmcalidet contributors. All rights reserved.
"""Train a CaliDet (or any mmdet) detector with mmengine's Runner.

    python tools/train.py configs/calidet/calidet_dino_tiny_coco-mini.py
    mim train mmcalidet configs/calidet/calidet_dino_tiny_coco-mini.py
    tools/dist_train.sh <config> <num processes> [options]   # multi-process

Beside mmengine's Runner, the tool
- initialises the gloo process group itself for ``--launcher pytorch`` on
  a machine without GPUs (mmengine's ``init_dist`` selects a CUDA device)
  and wraps the model in DDP without device ids;
- adds a :class:`CheckpointCompatHook` (what of a checkpoint does not fit
  the model, in CaliDet's terms) unless the config has one;
- stops with one line (exit status 1) when a CaliDet model meets NaN or
  inf (:class:`~mmcalidet.models.NonFiniteError`: the iteration and the
  loss terms or head outputs that are not finite).
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmcalidet  # noqa: F401  (registers the modules and checkpoint types)
import mmcalidet.engine.checkpoint_hooks  # noqa: F401  (registers hooks)
from mmcalidet.models import NonFiniteError
from mmcalidet.utils.checkpoint import name_checkpoint
from mmcalidet.utils.checkpoint_compat import CheckpointError
from mmcalidet.utils.cli import run_tool, tool_error
from mmcalidet.utils.cpu_dist import init_cpu_distributed


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='where to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the lr by the actual batch size (auto_scale_lr)')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this checkpoint, or (no value) from the latest '
        'one in the work dir')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. train_cfg.max_iters=10')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def add_checkpoint_compat_hook(cfg: Config, **kwargs) -> None:
    """Append a ``CheckpointCompatHook`` to ``cfg.custom_hooks`` unless the
    config has one.

    Args:
        cfg (Config): the config (changed in place).
        **kwargs: the hook's arguments.
    """
    hooks = list(cfg.get('custom_hooks', None) or [])
    if not any(h.get('type') == 'CheckpointCompatHook' for h in hooks):
        hooks.append(dict(type='CheckpointCompatHook', **kwargs))
    cfg.custom_hooks = hooks


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise RuntimeError('--auto-scale-lr needs '
                               'auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    add_checkpoint_compat_hook(cfg)
    init_cpu_distributed(cfg)

    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg \
        else RUNNERS.build(cfg)
    try:
        runner.train()
    except CheckpointError as exc:  # of load_from / --resume
        raise name_checkpoint(exc, cfg.get('load_from')) from exc
    except NonFiniteError as exc:
        runner.logger.error(str(exc))  # in the log file too
        raise tool_error(str(exc)) from None


if __name__ == '__main__':
    # a bad checkpoint (unreadable, not fitting, invalid prior): one line
    run_tool(main, errors=(CheckpointError, ))
