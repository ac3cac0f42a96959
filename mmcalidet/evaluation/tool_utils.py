# Copyright (c) mmcalidet contributors. All rights reserved.
"""Shared plumbing of the evaluation tools (``tools/analysis_tools/
eval_priors.py``, ``eval_subsets.py``, ``self_calibrate.py``): build the
detectors, cache them once, and assemble the methods the tables compare.
"""
import argparse
import copy
import logging
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .baselines import CORRECTION_NAMES, CORRECTIONS, build_correction
from .cache import cache_hidden_states
from .coco import CocoEvaluator, coco_evaluator_from_cfg
from .scoring import Rescorer, is_calibratable
from .sweep import Method


def add_model_args(parser: argparse.ArgumentParser,
                   baselines: bool = True) -> None:
    """The options shared by the evaluation tools."""
    parser.add_argument(
        '--baseline-config',
        help='config of a plain detector (e.g. DINO) to compare with')
    parser.add_argument(
        '--baseline-checkpoint', help='checkpoint of the plain detector')
    if baselines:
        parser.add_argument(
            '--posthoc',
            nargs='*',
            choices=CORRECTIONS,
            default=None,
            help='post-hoc prior corrections of the plain detector (default '
            'both when a baseline is given)')
        parser.add_argument(
            '--cooc-beta',
            type=float,
            default=1.0,
            help='strength of the co-occurrence rescoring')
    parser.add_argument(
        '--train-prior',
        help='E_t (prior file or shipped name); default the config\'s '
        '`prior`, else the checkpoint\'s deployment prior')
    parser.add_argument(
        '--max-images',
        type=int,
        help='evaluate only the first N images of the test set')
    parser.add_argument(
        '--batch-size',
        type=int,
        help='evaluation batch size (the E_b batches); default the '
        'config\'s test_dataloader.batch_size')
    parser.add_argument(
        '--rescore-batch-size',
        type=int,
        default=64,
        help='images per re-scoring step')
    parser.add_argument(
        '--cache-dir',
        help='spill the decoder cache to this folder instead of memory')
    parser.add_argument(
        '--cache-dtype',
        choices=['float32', 'float16'],
        default='float32',
        help='cache storage (float16: half the memory, approximate)')
    parser.add_argument(
        '--eval-workers',
        type=int,
        default=0,
        help='COCO evaluations in parallel processes (eval_priors.py)')
    parser.add_argument(
        '--device',
        default='cuda' if torch.cuda.is_available() else 'cpu',
        help='device (default cuda when available)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=None,
        metavar='KEY=VALUE',
        help='override entries of both configs')
    parser.add_argument(
        '--out-dir', default='work_dirs/eval', help='where to write results')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bars')


def quiet_mmengine() -> None:
    """Keep mmengine's INFO logs (weight loading, init) off the console."""
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().setLevel(logging.WARNING)


def _cfg_options(items: Optional[Sequence[str]]) -> Dict:
    if not items:
        return {}
    from mmengine.config import DictAction
    ns = argparse.Namespace()
    DictAction(option_strings=[], dest='opts')(None, ns, list(items))
    return ns.opts


def load_config(config: str,
                cfg_options=None,
                max_images=None,
                batch_size=None):
    """Load a config with the tools' overrides."""
    from mmengine.config import Config
    if not osp.isfile(config):
        raise ValueError(f'config not found: {config}')
    cfg = Config.fromfile(config)
    opts = _cfg_options(cfg_options)
    if opts:
        cfg.merge_from_dict(opts)
    if max_images is not None:
        if max_images < 1:
            raise ValueError('--max-images must be >= 1')
        cfg.test_dataloader.dataset.indices = int(max_images)
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError('--batch-size must be >= 1')
        cfg.test_dataloader.batch_size = int(batch_size)
    cfg.test_dataloader.num_workers = min(
        cfg.test_dataloader.get('num_workers', 0), 2)
    if not cfg.test_dataloader.num_workers:
        cfg.test_dataloader.persistent_workers = False
    return cfg


def build_detector(cfg, checkpoint: Optional[str], device: str = 'cpu'):
    """Build a detector and load its checkpoint (strictly).

    Args:
        cfg (Config): the config.
        checkpoint (str, optional): the checkpoint; ``'none'`` keeps
            random weights (for smoke tests and benchmarks only).
        device (str): the device.

    Returns:
        nn.Module: the detector in eval mode.
    """
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    if cfg.get('custom_imports'):
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**cfg.custom_imports)
    # a copy: mmdet's DETR detectors write into their bbox_head config, so
    # the same config could not build a second model
    model = MODELS.build(copy.deepcopy(cfg.model))
    if checkpoint in (None, 'none'):
        model.init_weights()
    else:
        if not osp.isfile(checkpoint):
            raise ValueError(f'checkpoint not found: {checkpoint}')
        try:
            ckpt = load_checkpoint(
                model, checkpoint, map_location='cpu', strict=True)
        except RuntimeError as exc:
            raise ValueError(f'checkpoint {checkpoint} does not fit the '
                             f'config: {str(exc).splitlines()[0]}') from exc
        meta = ckpt.get('meta', {}) if isinstance(ckpt, dict) else {}
        if meta.get('dataset_meta'):
            model.dataset_meta = meta['dataset_meta']
    return model.to(device).eval()


def build_test_loader(cfg):
    """The config's test data loader (single process)."""
    from mmengine.runner import Runner
    return Runner.build_dataloader(cfg.test_dataloader)


def load_train_prior(src, model, cfg,
                     classes: Sequence[str]) -> Tuple[np.ndarray, dict]:
    """E_t and its file's metadata (class frequencies for re-weighting).

    Args:
        src (str, optional): ``--train-prior``; default the config's
            ``prior`` (or ``model.prior``), else the model's deployment
            prior.
        model (nn.Module): the detector.
        cfg (Config): its config.
        classes (Sequence[str]): class order.

    Returns:
        tuple[np.ndarray, dict]: E_t and the file's extra keys.
    """
    from ..priors import default_prior_path, load_prior
    if src is None:
        src = cfg.get('prior', None) or cfg.model.get('prior', None)
    if src is None:
        if hasattr(model, 'get_prior'):
            return model.get_prior(), {}
        raise ValueError('pass --train-prior (E_t): the detector has no '
                         'deployment prior')
    if isinstance(src, str):
        path = src
        if not osp.exists(path) and osp.sep not in path and \
                not path.endswith(('.json', '.npy')):
            path = default_prior_path(path)
        matrix, meta = load_prior(
            path, classes=classes, num_classes=len(classes), return_meta=True)
        return matrix, meta
    return load_prior(src, num_classes=len(classes)), {}


def shares_trunk(model: torch.nn.Module, baseline: torch.nn.Module) -> bool:
    """Whether every weight of ``baseline`` is in ``model``, unchanged
    (a CaliDet model calibrated on the baseline's cached decoder outputs):
    then both have the same decoder outputs and one cache serves both."""
    if type(model.backbone) is not type(baseline.backbone):
        return False
    mine = model.state_dict()
    for key, value in baseline.state_dict().items():
        other = mine.get(key)
        if other is None or other.shape != value.shape or \
                not torch.equal(other, value):
            return False
    return True


class EvalSetup:
    """The detectors of a tool run, cached once on the same images.

    Attributes:
        methods (list[Method]): the rows of the tables.
        cache (HiddenStateCache): the main model's cache.
        evaluator (CocoEvaluator): COCO metrics of the test set.
        train_prior (np.ndarray): E_t.
        classes (list[str]): class names.
        model: the main detector.
        info (dict): what was run (for the JSON reports).
    """

    def __init__(self,
                 args: argparse.Namespace,
                 baselines: bool = True,
                 need_calibratable: bool = False) -> None:
        progress = not args.no_progress
        quiet_mmengine()
        cfg = load_config(args.config, args.cfg_options, args.max_images,
                          args.batch_size)
        loader = build_test_loader(cfg)
        classes = list(loader.dataset.metainfo['classes'])
        model = build_detector(cfg, args.checkpoint, args.device)
        model.dataset_meta = dict(loader.dataset.metainfo)
        if need_calibratable and not is_calibratable(model):
            raise ValueError(f'{type(model).__name__} is not a CaliDet '
                             'detector (it takes no prior)')
        self.classes = classes
        self.model = model
        self.train_prior, self.train_meta = load_train_prior(
            args.train_prior, model, cfg, classes)
        self.evaluator: CocoEvaluator = coco_evaluator_from_cfg(cfg, classes)
        dtype = getattr(torch, args.cache_dtype)
        self.cache = cache_hidden_states(
            model,
            loader,
            spill_dir=None if args.cache_dir is None else osp.join(
                args.cache_dir, 'model'),
            dtype=dtype,
            progress=progress)
        self.methods: List[Method] = []
        self.info = dict(
            config=args.config,
            checkpoint=args.checkpoint,
            num_images=len(self.cache),
            eval_batch_size=loader.batch_size,
            cache_bytes_per_image=self.cache.bytes_per_image,
            cache_dtype=args.cache_dtype,
            device=str(args.device))
        posthoc = getattr(args, 'posthoc', None)
        self._add(model, self.cache, args, posthoc, baselines)
        if args.baseline_config or args.baseline_checkpoint:
            if not (args.baseline_config and args.baseline_checkpoint):
                raise ValueError('pass both --baseline-config and '
                                 '--baseline-checkpoint')
            bcfg = load_config(args.baseline_config, args.cfg_options,
                               args.max_images, args.batch_size)
            bloader = build_test_loader(bcfg)
            bmodel = build_detector(bcfg, args.baseline_checkpoint,
                                    args.device)
            bmodel.dataset_meta = dict(bloader.dataset.metainfo)
            if shares_trunk(model, bmodel):
                # a calibrator trained on the baseline's cached outputs:
                # the same decoder outputs, one cache
                bcache = self.cache
            else:
                bcache = cache_hidden_states(
                    bmodel,
                    bloader,
                    spill_dir=None if args.cache_dir is None else osp.join(
                        args.cache_dir, 'baseline'),
                    dtype=dtype,
                    progress=progress)
            self.info['shared_cache'] = bcache is self.cache
            if bcache.img_ids() != self.cache.img_ids():
                raise ValueError('the baseline config evaluates other images '
                                 '(or another order) than the main config')
            self._add(bmodel, bcache, args, posthoc, baselines)
            self.info.update(
                baseline_config=args.baseline_config,
                baseline_checkpoint=args.baseline_checkpoint)

    def _add(self, model, cache, args, posthoc, baselines: bool) -> None:
        name = type(model).__name__
        batch = args.rescore_batch_size
        self.methods.append(
            Method(name, Rescorer(model, cache, batch_size=batch)))
        if is_calibratable(model) or not baselines:
            return
        from .baselines import class_frequencies
        for corr in (CORRECTIONS if posthoc is None else posthoc):
            freq = None
            if corr == 'reweight':
                if posthoc is None and \
                        'images_per_class' not in self.train_meta:
                    continue  # not asked for, and no class frequencies
                freq = class_frequencies(self.train_meta, self.classes)
            kwargs = dict(beta=args.cooc_beta) if corr == 'cooccurrence' \
                else {}
            fn = build_correction(corr, self.train_prior, freq, **kwargs)
            self.methods.append(
                Method(f'{name} + {CORRECTION_NAMES[corr]}',
                       Rescorer(model, cache, fn, batch)))


def ensure_out_dir(path: str) -> str:
    """Create the output folder."""
    os.makedirs(path, exist_ok=True)
    return path
