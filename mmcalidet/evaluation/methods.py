# Copyright (c) mmcalidet contributors. All rights reserved.
"""The detectors of an evaluation run and the methods (table rows) they
give: each detector is built from its config and checkpoint, its decoder
outputs are cached once, and a plain detector adds its post-hoc
corrections. The tools parse their options with
``tools/analysis_tools/eval_options.py`` and pass them here as plain
arguments.
"""
import json
import logging
import os.path as osp
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..models.head_kinds import head_kind_of
from ..priors.prior import Prior
from ..utils.log_level import mmengine_log_level
from ..utils.validation import check_float, check_int
from .baselines import (CORRECTION_NAMES, CORRECTIONS, build_correction,
                        class_frequencies)
from .cache import cache_hidden_states, eval_fingerprint
from .coco import CocoEvaluator, coco_evaluator_from_cfg
from .feature_cache import FeatureCache
from .head_scoring import is_plain_two_stage, rescorer_for
from .scoring import Rescorer, is_calibratable
from .sweep import Method


def load_config(config: str,
                cfg_options: Optional[Dict] = None,
                max_images: Optional[int] = None,
                batch_size: Optional[int] = None):
    """Load a config with the evaluation's overrides.

    Args:
        config (str): the config file.
        cfg_options (dict, optional): overrides (``merge_from_dict``).
        max_images (int, optional): evaluate the first N test images.
        batch_size (int, optional): the test batch size (the E_b batches).

    Returns:
        Config: the config (at most 2 test data loader workers).
    """
    from mmengine.config import Config
    if not osp.isfile(config):
        raise ValueError(f'config not found: {config}')
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
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
    """:func:`mmcalidet.apis.init_detector` (mmdet's, with the strict
    checkpoint check) for a loaded config; ``checkpoint`` ``None`` or
    ``'none'`` keeps random weights (smoke tests and benchmarks only)."""
    from ..apis import init_detector
    if checkpoint in (None, 'none'):
        checkpoint = None
    elif not osp.isfile(checkpoint):
        raise ValueError(f'checkpoint not found: {checkpoint}')
    return init_detector(cfg, checkpoint, device=device)


def build_test_loader(cfg):
    """The config's test data loader (single process)."""
    from mmengine.runner import Runner
    return Runner.build_dataloader(cfg.test_dataloader)


def resolve_train_prior(src, model, cfg, classes: Sequence[str]) -> Prior:
    """E_t, with its support (the class frequencies of re-weighting).

    Args:
        src (optional): a prior source (a :class:`~mmcalidet.priors.Prior`,
            file, shipped name, matrix, see :meth:`Prior.load`); default
            the config's ``prior`` (or ``model.prior``), else the model's
            deployment prior.
        model (nn.Module): the detector.
        cfg (Config): its config.
        classes (Sequence[str]): class order.

    Returns:
        Prior: E_t in ``classes`` order.
    """
    if src is None:
        src = cfg.get('prior', None) or cfg.model.get('prior', None)
    if src is None:
        if hasattr(model, 'current_prior'):
            src = model.current_prior()
        else:
            raise ValueError('pass --train-prior (E_t): the detector has no '
                             'deployment prior')
    return Prior.load(src, classes=classes, num_classes=len(classes))


def has_decoder(model: torch.nn.Module) -> bool:
    """Whether ``model`` is evaluated on a decoder cache (a DETR-family
    detector); a one- or two-stage detector is evaluated on a
    :class:`FeatureCache` (its head kind's ``feature_cache``,
    :class:`~mmcalidet.evaluation.HeadRescorer`)."""
    return not head_kind_of(model).feature_cache


#: what of a data preprocessor decides the images a detector sees
_PREPROCESSING = ('pad_size_divisor', 'pad_value', '_channel_conversion',
                  '_enable_normalize')


def input_changes(cfg, baseline_cfg, model: torch.nn.Module,
                  baseline: torch.nn.Module) -> List[str]:
    """What differs between the test inputs of two detectors: the test
    set (images, annotation file, pipeline, ``indices``), the batch size
    (padding), the data preprocessor's normalisation and padding.

    Args:
        cfg (Config): the main detector's loaded config.
        baseline_cfg (Config): the baseline's.
        model (nn.Module): the main detector.
        baseline (nn.Module): the baseline.

    Returns:
        list[str]: e.g. ``['test_dataloader.dataset']``; empty when both
        see the same inputs.
    """
    changes = []
    mine, other = cfg.test_dataloader, baseline_cfg.test_dataloader
    if json.dumps(mine.get('dataset'), sort_keys=True, default=str) != \
            json.dumps(other.get('dataset'), sort_keys=True, default=str):
        changes.append('test_dataloader.dataset')
    if mine.get('batch_size') != other.get('batch_size'):
        changes.append('test_dataloader.batch_size')
    pre, base_pre = model.data_preprocessor, baseline.data_preprocessor
    for attr in _PREPROCESSING:
        if getattr(pre, attr, None) != getattr(base_pre, attr, None):
            changes.append(f'model.data_preprocessor.{attr.lstrip("_")}')
    for attr in ('mean', 'std'):
        a, b = getattr(pre, attr, None), getattr(base_pre, attr, None)
        same = (a is None and b is None) or (a is not None and b is not None
                                             and a.shape == b.shape
                                             and torch.equal(a.cpu(), b.cpu()))
        if not same:
            changes.append(f'model.data_preprocessor.{attr}')
    return changes


def shares_trunk(model: torch.nn.Module,
                 baseline: torch.nn.Module,
                 cfg=None,
                 baseline_cfg=None) -> bool:
    """Whether every weight of ``baseline`` is in ``model``, unchanged
    (a CaliDet model calibrated on the baseline's cached decoder outputs),
    and, with both configs given, both see the same test inputs
    (:func:`input_changes`): then both have the same decoder outputs
    and one cache serves both.

    Args:
        model (nn.Module): the main detector.
        baseline (nn.Module): the baseline.
        cfg (Config, optional): the main detector's loaded config.
        baseline_cfg (Config, optional): the baseline's.

    Returns:
        bool: one cache serves both.
    """
    if type(model.backbone) is not type(baseline.backbone):
        return False
    mine = model.state_dict()
    for key, value in baseline.state_dict().items():
        other = mine.get(key)
        if other is None or other.shape != value.shape or \
                not torch.equal(other, value):
            return False
    if cfg is not None and baseline_cfg is not None and \
            input_changes(cfg, baseline_cfg, model, baseline):
        return False
    return True


class EvalSetup:
    """The detectors of an evaluation run, cached once on the same images.

    Args:
        config (str): the main detector's config (CaliDet or plain).
        checkpoint (str): its checkpoint (``'none'``: random weights).
        baseline_config (str, optional): a plain detector to compare with.
        baseline_checkpoint (str, optional): its checkpoint.
        posthoc (Sequence[str], optional): post-hoc corrections of a plain
            detector (:data:`CORRECTIONS`; one named twice is compared
            once); ``None``: both, the marginal re-weighting only when
            E_t's file has class frequencies; for a plain two-stage
            detector the re-weighting only (its RoI head scores with a
            softmax).
        cooc_beta (float): strength of the co-occurrence rescoring.
        train_prior (optional): E_t (see :func:`train_prior`).
        max_images (int, optional): evaluate the first N test images.
        batch_size (int, optional): the test batch size (the E_b batches).
        rescore_batch_size (int): images per re-scoring step.
        cache_dir (str, optional): keep the decoder caches in this folder,
            one sub-folder per fingerprint (config's model and test set,
            checkpoint, batch size, dtype): a later run with the same ones
            reuses it instead of running the detector; ``None``: in memory.
        cache_dtype (str): ``'float32'`` or ``'float16'`` (approximate).
        device (str): the device.
        cfg_options (dict, optional): overrides of both configs.
        progress (bool): show progress bars.
        report (callable): where the stage lines go (a cache reused or
            made, a stale cache remade); default ``print``.

    Attributes:
        methods (list[Method]): the rows of the tables.
        cache (DecoderCache | FeatureCache): the main model's cache (a
            FeatureCache for a one- or two-stage detector).
        evaluator (CocoEvaluator): COCO metrics of the test set.
        train (Prior): E_t, with its support; ``train_prior`` its matrix.
        classes (list[str]): class names.
        model: the main detector.
        info (dict): what was run (for the JSON reports); with a
            ``cache_dir``, ``decoder_caches`` gives each detector's cache
            folder and whether it was reused.
    """

    def __init__(self,
                 config: str,
                 checkpoint: str,
                 baseline_config: Optional[str] = None,
                 baseline_checkpoint: Optional[str] = None,
                 posthoc: Optional[Sequence[str]] = None,
                 cooc_beta: float = 1.0,
                 train_prior=None,
                 max_images: Optional[int] = None,
                 batch_size: Optional[int] = None,
                 rescore_batch_size: int = 64,
                 cache_dir: Optional[str] = None,
                 cache_dtype: str = 'float32',
                 device: str = 'cpu',
                 cfg_options: Optional[Dict] = None,
                 progress: bool = True,
                 report: Callable[[str], None] = print) -> None:
        if bool(baseline_config) != bool(baseline_checkpoint):
            raise ValueError('pass both --baseline-config and '
                             '--baseline-checkpoint')
        self.posthoc = None if posthoc is None else list(
            dict.fromkeys(posthoc))
        self.cooc_beta = check_float('cooc_beta', cooc_beta)
        check_int('max_images', max_images, 1, allow_none=True)
        check_int('batch_size', batch_size, 1, allow_none=True)
        check_int('rescore_batch_size', rescore_batch_size, 1)
        self.rescore_batch_size = rescore_batch_size
        self.methods: List[Method] = []
        self.info = dict(config=config, checkpoint=checkpoint)

        self._options = dict(
            train_prior=train_prior,
            max_images=max_images,
            batch_size=batch_size,
            cache_dir=cache_dir,
            cache_dtype=cache_dtype,
            device=device,
            cfg_options=cfg_options,
            progress=progress,
            report=report)
        # weight loading and init reports
        with mmengine_log_level(at_least=logging.WARNING):
            self.model, self.cache = self._build(config, checkpoint, 'model')
        self.info.update(
            num_images=len(self.cache),
            cache_bytes_per_image=self.cache.bytes_per_image,
            cache_dtype=cache_dtype,
            device=str(device))
        self._add(self.model, self.cache)
        if baseline_config:
            with mmengine_log_level(at_least=logging.WARNING):
                bmodel, bcache = self._build(baseline_config,
                                             baseline_checkpoint, 'baseline')
            self.info['shared_cache'] = bcache is self.cache
            if bcache.img_ids() != self.cache.img_ids():
                raise ValueError('the baseline config evaluates other images '
                                 '(or another order) than the main config')
            self._add(bmodel, bcache)
            self.info.update(
                baseline_config=baseline_config,
                baseline_checkpoint=baseline_checkpoint)

    def _build(self, config: str, checkpoint: str, name: str) -> Tuple:
        """One detector and its decoder cache (the main model's when the
        baseline shares its trunk).

        Args:
            config (str): the detector's config.
            checkpoint (str): its checkpoint.
            name (str): ``'model'`` (the main detector: it sets the
                classes, E_t and the evaluator) or ``'baseline'``.

        Returns:
            tuple: the model and its cache.
        """
        opts = self._options
        cfg = load_config(config, opts['cfg_options'], opts['max_images'],
                          opts['batch_size'])
        loader = build_test_loader(cfg)
        model = build_detector(cfg, checkpoint, opts['device'])
        model.dataset_meta = dict(loader.dataset.metainfo)
        if name == 'model':
            self.cfg = cfg
            self.classes = list(loader.dataset.metainfo['classes'])
            self.info['eval_batch_size'] = loader.batch_size
            self.train = resolve_train_prior(opts['train_prior'], model, cfg,
                                             self.classes)
            self.train_prior = np.array(self.train.matrix)
            self.evaluator: CocoEvaluator = coco_evaluator_from_cfg(
                cfg, self.classes)
        elif shares_trunk(self.model, model, self.cfg, cfg):
            # a calibrator trained on the baseline's cached outputs: the
            # same decoder outputs, one cache
            return model, self.cache
        return model, self._cache(model, loader, cfg, checkpoint, name)

    def _cache(self, model, loader, cfg, checkpoint: str, name: str):
        """The decoder cache of ``model`` on the test loader: in memory, or
        made or reused in the ``cache_dir`` (reported, and recorded in
        ``info['decoder_caches']``); for a one- or two-stage detector (no
        decoder), its :class:`FeatureCache`, in memory."""
        opts = self._options
        cache_dir, dtype = opts['cache_dir'], opts['cache_dtype']
        if not has_decoder(model):
            if cache_dir is not None:
                opts['report'](f'{name}: {type(model).__name__} has no '
                               'decoder; its features stay in memory (the '
                               'cache folder holds decoder caches)')
            return FeatureCache.from_batches(
                model, loader, progress=opts['progress'], total=len(loader))
        fingerprint = None if cache_dir is None else eval_fingerprint(
            cfg, checkpoint, model, loader.batch_size, dtype)
        cache = cache_hidden_states(
            model,
            loader,
            cache_dir=cache_dir,
            fingerprint=fingerprint,
            dtype=dtype,
            progress=opts['progress'],
            logger=opts['report'])
        if cache_dir is not None:
            state = 'reused' if cache.reused else 'made'
            opts['report'](f'decoder cache {cache.folder}: {state} '
                           f'({len(cache)} images)')
            self.info.setdefault('decoder_caches', {})[name] = dict(
                folder=cache.folder, reused=cache.reused)
        return cache

    def _register_train_support(self, rescorer: Rescorer) -> None:
        """A support-aware CaliFormer (experimental) scores E_t with the
        support it records (``num_images``, ``images_per_class``), as
        ``set_prior`` of that file does."""
        if rescorer.reads_support and self.train.has_support:
            rescorer.register_support(self.train_prior,
                                      *self.train.support_pair())

    def _add(self, model, cache) -> None:
        name = type(model).__name__
        batch = self.rescore_batch_size
        rescorer = rescorer_for(model, cache, batch_size=batch)
        self.methods.append(Method(name, rescorer))
        if is_calibratable(model):
            self._register_train_support(rescorer)
            return
        posthoc = self.posthoc
        if posthoc is None and is_plain_two_stage(model):
            # a RoI head's softmax has the re-weighting only (the
            # co-occurrence rescoring, asked for by name, is refused)
            self._options['report'](f'{name}: the marginal re-weighting '
                                    'only (its RoI head scores with a '
                                    'softmax)')
            posthoc = ['reweight']
        for corr in (CORRECTIONS if posthoc is None else posthoc):
            freq = None
            if corr == 'reweight':
                if self.posthoc is None and not self.train.has_support:
                    continue  # not asked for, and no class frequencies
                freq = class_frequencies(self.train)
            kwargs = dict(beta=self.cooc_beta) if corr == 'cooccurrence' \
                else {}
            fn = build_correction(corr, self.train_prior, freq, **kwargs)
            self.methods.append(
                Method(f'{name} + {CORRECTION_NAMES[corr]}',
                       rescorer_for(model, cache, fn, batch)))
