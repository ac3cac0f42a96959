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
  loss terms or head outputs that are not finite);
- checks the config's priors (``model.prior``, an EdgeSampler's
  ``prior``) before building anything: a file that is missing, of another
  K, with NaN or with class names that are not the training set's is one
  line (:class:`ConfigPriorError`), not a traceback from the first
  training step;
- names a calibrator's baseline once (:func:`~mmcalidet.decoder_cache.
  match_baseline`): ``load_from`` fills the decoder cache's
  ``source.checkpoint`` (or the other way round), and two different
  detectors there are one line (:class:`TrunkMismatchError`);
- resumes a run without ``randomness.seed`` with the seed its checkpoint
  records (:func:`~mmcalidet.engine.restore_run_seed`), so that the
  resumed run repeats the interrupted one;
- checks, before the first iteration, that the training set's classes fit
  the model's head (:class:`TrainClassesError`: e.g. an 80-class decoder
  cache for a 10-class calibrator);
- prints its help (``-h``) before torch and mmdet load: ``mim train``
  runs ``train.py -h`` before every training (0.3 s instead of 5 s).
"""
import argparse
import os
import os.path as osp
import sys
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.config import Config, DictAction


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


if __name__ == '__main__' and {'-h', '--help'} & set(sys.argv[1:]):
    # the help before torch and mmdet load (``mim train`` runs
    # ``train.py -h`` before every training to read its options)
    parse_args()

from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import is_model_wrapper  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import mmcalidet  # noqa: F401,E402  (registers modules, checkpoint types)
import mmcalidet.engine.checkpoint_hooks  # noqa: F401,E402  (the hooks)
from mmcalidet.decoder_cache import (CacheError,  # noqa: E402
                                     TrunkMismatchError, check_cache,
                                     match_baseline)
from mmcalidet.engine.run_seed import restore_run_seed  # noqa: E402
from mmcalidet.models import NonFiniteError  # noqa: E402
from mmcalidet.priors.prior import Prior  # noqa: E402
from mmcalidet.utils.checkpoint import name_checkpoint  # noqa: E402
from mmcalidet.utils.checkpoint_compat import CheckpointError  # noqa: E402
from mmcalidet.utils.cli import run_tool, tool_error  # noqa: E402
from mmcalidet.utils.config_text import cache_config_formatting  # noqa: E402
from mmcalidet.utils.cpu_dist import init_cpu_distributed  # noqa: E402


class ConfigPriorError(ValueError):
    """A prior of the config that the model would refuse (missing file,
    another K, values, class names), named by its config key."""


class TrainClassesError(ValueError):
    """The training set has more classes than the model's head."""


#: the errors printed in one line: a bad checkpoint (unreadable, not
#: fitting, invalid prior), a bad prior in the config, a training set of
#: more classes than the model's head, a torn or damaged decoder cache
ERRORS = (CheckpointError, ConfigPriorError, TrainClassesError,
          TrunkMismatchError, CacheError)


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


def config_priors(node: Any,
                  where: str = 'model') -> Iterator[Tuple[str, Any]]:
    """The ``prior`` entries of a model config, with their keys.

    Args:
        node: a config (dict) or a list of them.
        where (str): the key of ``node``.

    Yields:
        tuple[str, Any]: ``('model.data_preprocessor.prior', value)``...
        for every ``prior`` that is not ``None``.
    """
    if isinstance(node, dict):
        for key, value in node.items():
            if key == 'prior':
                if value is not None:
                    yield f'{where}.prior', value
            else:
                yield from config_priors(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for k, value in enumerate(node):
            yield from config_priors(value, f'{where}.{k}')


def train_classes(cfg: Config) -> Optional[List[str]]:
    """The training set's class names as its config gives them (its
    ``metainfo`` or its type's ``METAINFO``), else ``None``."""
    dataset = cfg.get('train_dataloader', {}).get('dataset', {})
    classes = (dataset.get('metainfo') or {}).get('classes')
    if classes is None and isinstance(dataset.get('type'), str):
        from mmdet.registry import DATASETS
        try:
            dataset_type = DATASETS.get(dataset.get('type'))
        except KeyError:  # another scope's: the runner will say
            dataset_type = None
        classes = getattr(dataset_type, 'METAINFO', {}).get('classes')
    return list(classes) if classes is not None else None


def check_config_priors(cfg: Config) -> None:
    """Load every prior of ``cfg.model`` as the model would, before
    anything is built.

    Args:
        cfg (Config): the training config.

    Raises:
        ConfigPriorError: naming the config key and the problem.
    """
    head = cfg.model.get('bbox_head') or {}
    num_classes = head.get('num_classes')
    classes = None
    for where, src in config_priors(cfg.model):
        if classes is None:
            classes = train_classes(cfg) or []
        try:
            Prior.load(src, classes=classes or None, num_classes=num_classes)
        except ValueError as exc:
            raise ConfigPriorError(f'{where}: {exc}') from exc


class TrainClassesHook(Hook):
    """Before the first iteration: the training set's classes must fit the
    model's head (its labels index the head's logits)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        """Compare the training set's class count with the head's.

        Args:
            runner: the runner.

        Raises:
            TrainClassesError: the training set has more classes.
        """
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        num_classes = getattr(
            getattr(model, 'bbox_head', None), 'num_classes', None)
        dataset = runner.train_dataloader.dataset
        classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
        if num_classes is None or classes is None or \
                len(classes) <= num_classes:
            return
        source = getattr(dataset, 'cache_dir', None) or getattr(
            getattr(dataset, 'cache', None), 'folder', None)
        what = type(dataset).__name__ + (f' {source}' if source else '')
        raise TrainClassesError(
            f'the training set ({what}) has {len(classes)} classes, the '
            f'model\'s head {num_classes} (model.bbox_head.num_classes): '
            'its labels do not fit the head; train on a dataset (or a '
            'decoder cache made from a detector) of the model\'s classes')


def check_existing_cache(cfg) -> None:
    """Validate the decoder cache a calibrator config trains on without a
    ``source`` (nothing would remake it), so that a torn one is named in
    one line before the runner makes its work_dir.

    Raises:
        CacheError: naming the torn, missing or garbled file.
    """
    loader = cfg.get('train_dataloader') or {}
    dataset = loader.get('dataset') if hasattr(loader, 'get') else None
    while hasattr(dataset, 'get') and dataset.get('type') != \
            'DecoderCacheDataset' and hasattr(dataset.get('dataset'), 'get'):
        dataset = dataset.get('dataset')
    if not hasattr(dataset, 'get') or \
            dataset.get('type') != 'DecoderCacheDataset' or \
            dataset.get('source') is not None:
        return
    cache_dir = dataset.get('cache_dir')
    if cache_dir and osp.isdir(cache_dir):
        check_cache(cache_dir)


def main(argv=None) -> None:
    args = parse_args(argv)
    cache_config_formatting()  # mmengine formats the config 5+ times
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
    # the baseline a calibrator calibrates, before --resume names another
    # checkpoint in load_from
    match_baseline(cfg)
    check_existing_cache(cfg)
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    seed = restore_run_seed(cfg)
    if seed is not None:
        print(
            f'resuming with the interrupted run\'s seed {seed} '
            '(randomness.seed)',
            flush=True)
    add_checkpoint_compat_hook(cfg)
    check_config_priors(cfg)
    init_cpu_distributed(cfg)

    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg \
        else RUNNERS.build(cfg)
    runner.register_hook(TrainClassesHook())
    try:
        runner.train()
    except CheckpointError as exc:  # of load_from / --resume
        raise name_checkpoint(exc, cfg.get('load_from')) from exc
    except NonFiniteError as exc:
        runner.logger.error(str(exc))  # in the log file too
        raise tool_error(str(exc)) from None


if __name__ == '__main__':
    run_tool(main, errors=ERRORS)
