# Copyright (c) mmcalidet contributors. All rights reserved.
"""The base of the protocol's test loops: one pass over the test data
loader that caches the decoder outputs (see ``loops.py``)."""
from typing import Dict, Optional

import numpy as np
import torch
from mmengine.dist import get_world_size
from mmengine.model import is_model_wrapper
from mmengine.runner import TestLoop

from ..evaluation import CocoEvaluator, cache_hidden_states
from ..priors import load_prior_source, model_classes, validate_prior


class CachedTestLoop(TestLoop):
    """A test loop that caches the decoder outputs in one pass.

    Args:
        runner (Runner): the runner.
        dataloader (DataLoader | dict): the test data loader.
        evaluator (Evaluator | dict | list): the test evaluator.
        fp16 (bool): autocast the pass. Defaults to False.
        train_prior (str | array-like, optional): E_t (a prior file or
            shipped name); default the model's deployment prior when the
            loop starts (the checkpoint's).
        spill_dir (str, optional): write the cache to a private folder
            there (removed after the run) instead of memory.
        cache_dtype (str): ``'float32'`` (exact) or ``'float16'``.
        rescore_batch_size (int): images per re-scoring step.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator,
                 fp16: bool = False,
                 train_prior=None,
                 spill_dir: Optional[str] = None,
                 cache_dtype: str = 'float32',
                 rescore_batch_size: int = 64) -> None:
        super().__init__(runner, dataloader, evaluator, fp16)
        self.train_prior_src = train_prior
        self.spill_dir = spill_dir
        self.cache_dtype = getattr(torch, cache_dtype)
        self.rescore_batch_size = rescore_batch_size
        self.e_t: Optional[np.ndarray] = None

    @property
    def detector(self):
        model = self.runner.model
        return model.module if is_model_wrapper(model) else model

    def train_prior(self) -> np.ndarray:
        """E_t as a K x K array."""
        model = self.detector
        if self.train_prior_src is None:
            return model.get_prior()
        return load_prior_source(self.train_prior_src, model_classes(model),
                                 model.bbox_head.num_classes)

    def build_cache(self):
        """One pass over the data loader with the iteration hooks."""
        if get_world_size() > 1:
            raise RuntimeError(f'{type(self).__name__} runs in a single '
                               'process')
        model = self.detector
        model.eval()

        def before(batch_id, batch):
            self.runner.call_hook(
                'before_test_iter', batch_idx=batch_id, data_batch=batch)

        def after(batch_id, batch, outputs):
            self.runner.call_hook(
                'after_test_iter',
                batch_idx=batch_id,
                data_batch=batch,
                outputs=outputs)

        with torch.autocast(
                device_type=next(model.parameters()).device.type,
                enabled=self.fp16):
            return cache_hidden_states(
                model,
                self.dataloader,
                cache_dir=self.spill_dir,
                dtype=self.cache_dtype,
                progress=False,
                callback=after,
                before_batch=before)

    def coco_evaluator(self) -> CocoEvaluator:
        """A :class:`CocoEvaluator` on the ``CocoMetric`` of the test
        evaluator (its loaded annotations are reused)."""
        classes = self.dataloader.dataset.metainfo['classes']
        for metric in self.evaluator.metrics:
            api = getattr(metric, '_coco_api', None)
            if api is not None:
                return CocoEvaluator(api, classes)
        raise ValueError(f'{type(self).__name__} needs a CocoMetric with an '
                         'ann_file in test_evaluator')

    def run(self) -> Dict:
        # E_t as the loop starts (hooks may inject priors during the pass)
        self.e_t = validate_prior(self.train_prior())
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        cache = self.build_cache()
        metrics = self.evaluate_cache(cache)
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')
        return metrics

    def evaluate_cache(self, cache) -> Dict:
        raise NotImplementedError
