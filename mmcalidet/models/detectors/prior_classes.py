# Copyright (c) mmcalidet contributors. All rights reserved.
"""Named priors matched to the model's classes by name, once.

A prior file (or shipped name) records its class names. Loaded while the
model's classes are unknown, it stays in the file's order until the classes
are known: when ``dataset_meta`` is first set (``init_detector``, the
tools), or before training by :class:`~mmcalidet.engine.PriorClassesHook`
(mmengine's runner never sets ``dataset_meta``). The same holds for the
prior of every EdgeSampler in the data preprocessor.
"""
import contextlib
import contextvars
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ...priors import reorder_prior
from ..data_preprocessors import EdgeSampler

# set inside defer_class_matching(): dataset_meta is stored, not matched
_DEFER_CLASS_MATCHING = contextvars.ContextVar(
    'mmcalidet_defer_class_matching', default=False)


@contextlib.contextmanager
def defer_class_matching():
    """Within this block, setting a CaliDet detector's ``dataset_meta``
    does not match its named priors to the classes (the first
    ``dataset_meta`` set after the block does). For a builder that sets
    placeholder classes, as mmdet's ``init_detector`` sets COCO's when no
    checkpoint is given."""
    token = _DEFER_CLASS_MATCHING.set(True)
    try:
        yield
    finally:
        _DEFER_CLASS_MATCHING.reset(token)


class PriorClassesMixin:
    """Matches a CaliDet detector's named priors (its own and its
    EdgeSamplers') to its classes by name, once; a base of
    :class:`~mmcalidet.models.detectors.CalibratableDetectorMixin`.

    The detector sets ``_pending_prior`` (``(name, class names)`` of a
    named prior still in its file's order, else ``None``) and ``prior``.
    """

    @property
    def dataset_meta(self) -> dict:
        """The dataset's meta (``classes``, ...), as mmengine's runner and
        mmdet's ``init_detector`` set it.

        Setting it with ``classes`` the first time matches a named prior
        loaded before the classes were known (the model's and its
        EdgeSamplers') to them by name; nothing changes if one does not
        match.
        """
        meta = self.__dict__.get('_dataset_meta')
        if meta is None:
            raise AttributeError(f'{type(self).__name__} has no dataset_meta')
        return meta

    @dataset_meta.setter
    def dataset_meta(self, meta: dict) -> None:
        classes = meta.get('classes') if isinstance(meta, dict) else None
        if classes and not _DEFER_CLASS_MATCHING.get():
            self.match_prior_classes(list(classes))
        self.__dict__['_dataset_meta'] = meta

    def match_prior_classes(self, classes: List[str]) -> None:
        """Reorder the pending named priors (model and EdgeSamplers) to
        ``classes``; validate all before changing any. Done once: the
        first classes set are the model's (a later ``dataset_meta``, e.g. of
        an evaluation set, does not reorder the priors again)."""
        if self.__dict__.get('_classes_matched'):
            return
        matrix = self._reorder_pending(self._pending_prior,
                                       self.prior, classes, 'model.prior')
        samplers = []
        for i, sampler in self.edge_samplers():
            try:
                samplers.append((sampler, sampler.prior_in_order(classes)))
            except ValueError as exc:
                raise ValueError(
                    f'model.data_preprocessor.batch_augments[{i}]: {exc}'
                ) from exc
        source = self.__dict__.pop('_pending_support_source', None)
        support = None if source is None else self.resolve_prior_support(
            source, classes)
        if matrix is not None:
            with torch.no_grad():
                self.prior.copy_(torch.from_numpy(matrix))
            self._cali_cache = None
        if support is not None:
            self._set_support(support)
        self._pending_prior = None
        for sampler, sampler_matrix in samplers:
            if sampler_matrix is not None:
                sampler.dataset_prior = sampler_matrix
                sampler.prior_classes = list(classes)
            sampler.set_classes(classes)  # in order now: marks it checked
        self.__dict__['_classes_matched'] = True

    @staticmethod
    def _reorder_pending(pending: Optional[Tuple[str, List[str]]],
                         matrix: Tensor, classes: List[str],
                         what: str) -> Optional[np.ndarray]:
        """``matrix`` (a named prior still in its file's class order,
        ``pending = (name, names)``) reordered to ``classes``; ``None``
        when nothing is pending or the order is the same.

        Raises:
            ValueError: naming the prior and ``what`` holds it when its
                class names are not ``classes``.
        """
        if pending is None or pending[1] == classes:
            return None
        name, names = pending
        try:
            return reorder_prior(matrix.detach().cpu().double().numpy(),
                                 names, classes)
        except ValueError as exc:
            raise ValueError(
                f'the class names of {name} ({what}) do not match the '
                f"dataset's classes: {exc}") from exc

    def edge_samplers(self) -> List[Tuple[int, EdgeSampler]]:
        """The EdgeSamplers among the data preprocessor's batch augments,
        with their index in ``batch_augments``."""
        augments = getattr(self.data_preprocessor, 'batch_augments', None)
        return [(i, aug) for i, aug in enumerate(augments or [])
                if isinstance(aug, EdgeSampler)]

    def _configure_edge_samplers(self, prior) -> None:
        """Give every EdgeSampler the head's K and this detector's prior as
        E_t where its config leaves them out, so a config states each once;
        raise at build time where one states another value (it would
        otherwise draw priors of another K or another E_t).

        Args:
            prior: this detector's ``prior`` argument (``None``: none).
        """
        for i, sampler in self.edge_samplers():
            sampler.use_detector_defaults(
                self.num_classes,
                prior,
                classes=self.classes,
                where=f'model.data_preprocessor.batch_augments[{i}] '
                '(EdgeSampler)')

    def check_classes_matched(self) -> None:
        """Refuse to train with a named prior that was never matched to
        the training classes (it would be read in its file's order).

        Raises:
            RuntimeError: naming the prior and the missing hook.
        """
        if self._pending_prior is None or \
                self.__dict__.get('_classes_matched'):
            return
        raise RuntimeError(
            f'{self._pending_prior[0]} (model.prior) names its classes, but '
            "the training dataset's classes never reached the model: add "
            "dict(type='PriorClassesHook') to custom_hooks (the CaliDet "
            "configs have it: configs/_base_/calidet.py), or set the "
            "model's dataset_meta before training")
