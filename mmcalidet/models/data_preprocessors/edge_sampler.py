# Copyright (c) mmcalidet contributors. All rights reserved.
"""EdgeSampler: the edge sampling distribution of CaliDet (paper Sec. 3.2).

A batch augment of the detector's data preprocessor::

    model = dict(
        type='CaliDINO', prior='coco2017_train', ...,
        data_preprocessor=dict(
            type='DetDataPreprocessor', ...,
            batch_augments=[dict(type='EdgeSampler')]))

In a CaliDet detector, K and E_t come from one place: the sampler takes
``num_classes`` from the head and E_t from the detector's ``prior``.

This module holds the batch augment (its settings, E_t and the classes
it is read in, the attaching of the draws to the data samples); the
modes and the draws are :mod:`.edge_modes`'s.
"""
import os
import warnings
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmengine.dist import all_gather_object, get_rank, get_world_size
from torch import Tensor, nn

from ...priors import (describe_prior_source, label_lists_prior,
                       load_prior_source, reorder_prior,
                       training_dataset_classes)
from .edge_modes import EdgeModesMixin


@MODELS.register_module()
class EdgeSampler(EdgeModesMixin, nn.Module):
    """Give every training sample a prior E drawn from the edge sampling
    distribution.

    Per mini-batch: choose a mode (by default E_x, E_b or E_t with equal
    probability), add N(0, noise_std^2) noise (one noise matrix per distinct
    prior), clip to [0, 1] and reset the diagonal to 1. Each data sample
    gets the result as the field ``prior`` and its own statistics E_x (for
    LoMa) as ``sample_prior``, both float32 K x K tensors on the inputs'
    device. Only ``gt_instances`` count as present (mmdet keeps crowd boxes
    in ``ignored_instances``).

    With several ranks (``batch_scope``): ``'local'`` (the paper's: E_b of
    the mini-batch of one GPU, 2 images in the paper's 8 x 2 setting) draws
    on each rank from its own images, without communication; ``'global'``
    gathers the label lists of all ranks, so E_b (and the ``'group'``
    mode's groups) are over the global batch (16 images), and rank 0's
    draws (mode and noise) are used by all ranks. With one process both
    are the same.

    In a CaliDet detector (:class:`~mmcalidet.models.detectors.
    CalibratableDetectorMixin`), leave ``num_classes`` and ``prior`` out:
    the detector fills them at build time from its head's ``num_classes``
    and its own ``prior`` (the training prior E_t), so a config gives each
    once. Values given here must agree with the detector's (a
    ``ValueError`` names both otherwise).

    Args:
        num_classes (int, optional): K. ``None``: set by the detector (see
            :meth:`use_detector_defaults`).
        prior (str | PathLike | array-like | dict, optional): E_t: a prior
            file, a shipped name (e.g. ``'coco2017_train'``) or a K x K
            matrix. ``None``: the detector's ``prior``. Required (here or in
            the detector) when the ``'dataset'`` mode has a probability.
        classes (Sequence[str], optional): the dataset's class names, to
            reorder a named prior file. When not given, its CaliDet
            detector passes them (:meth:`set_classes`) when they are known:
            its ``dataset_meta`` set, or before training
            (:class:`~mmcalidet.engine.PriorClassesHook`); a named prior
            whose classes never came is refused at the first batch.
        mode_probs (dict, optional): probability (any non-negative weights,
            normalised) of each mode among ``'sample'``, ``'batch'``,
            ``'dataset'`` and ``'group'`` (see
            :data:`~.edge_modes.MODES`; ``'dataset'`` needs E_t).
            Defaults to ``dict(sample=1, batch=1, dataset=1)``.
        noise_std (float): sigma of the Gaussian noise. Defaults to 0.16.
        group_size (int): group size of the ``'group'`` mode (the paper's
            E_b(4)). Defaults to 4.
        seed (int, optional): seed of an own random generator; ``None``
            draws from numpy's global RNG (seeded by mmengine's
            ``randomness`` config).
        batch_scope (str): ``'local'`` (E_b per GPU, the paper's) or
            ``'global'`` (E_b over all ranks' images). Defaults to
            ``'local'``.
        support (bool): experimental, off by default. Also give
            every sample its prior's support: ``prior_support`` (K,), the
            images each column was measured on (1 for E_x, the group, batch
            or site size for E_b, the prior file's ``num_images`` or the
            site bank's size for E_t) and ``prior_marginals`` (K,), each
            class's share of those images. Read by a CaliFormer with
            ``support_features`` / ``lift_bias``. Defaults to False.
        site_support (tuple[int, int]): the range of the ``'sim_site'``
            mode's n, drawn log-uniform. Defaults to (1, 256).
        site_tilt_std (float): the ``'sim_site'`` mode's class tilt: each
            site draws t ~ N(0, std^2) per class and weights an image by
            ``exp(sum of t over its classes)``. Defaults to 1.0.
        site_bank_size (int): how many recent training images' label sets
            the ``'sim_site'`` mode draws from. Defaults to 4096.
    """

    BATCH_SCOPES = ('local', 'global')
    #: the modes that draw on E_t
    NEED_PRIOR = ('dataset', )

    def __init__(self,
                 num_classes: Optional[int] = None,
                 prior=None,
                 classes: Optional[Sequence[str]] = None,
                 mode_probs: Optional[Dict[str, float]] = None,
                 noise_std: float = 0.16,
                 group_size: int = 4,
                 seed: Optional[int] = None,
                 batch_scope: str = 'local',
                 support: bool = False,
                 site_support: Tuple[int, int] = (1, 256),
                 site_tilt_std: float = 1.0,
                 site_bank_size: int = 4096) -> None:
        super().__init__()
        lo, hi = site_support
        if not 1 <= lo <= hi:
            raise ValueError(f'EdgeSampler: site_support must be (lo, hi) '
                             f'with 1 <= lo <= hi, got {site_support}')
        if site_tilt_std < 0 or not np.isfinite(site_tilt_std):
            raise ValueError(f'EdgeSampler: site_tilt_std must be finite and '
                             f'>= 0, got {site_tilt_std}')
        if site_bank_size < 1:
            raise ValueError(f'EdgeSampler: site_bank_size must be >= 1, got '
                             f'{site_bank_size}')
        self.support = support
        self.site_support = (int(lo), int(hi))
        self.site_tilt_std = float(site_tilt_std)
        self.site_bank_size = int(site_bank_size)
        #: presence (M, K) of recent training images, the ``'sim_site'``
        #: mode's pool (a ring of ``site_bank_size`` rows)
        self._site_bank: Optional[np.ndarray] = None
        self._site_bank_next = 0
        self._site_bank_len = 0
        self._dataset_images: Optional[int] = None
        if batch_scope not in self.BATCH_SCOPES:
            raise ValueError(f'EdgeSampler: batch_scope must be one of '
                             f'{self.BATCH_SCOPES}, got {batch_scope!r}')
        self.batch_scope = batch_scope
        self.num_classes = num_classes
        self.modes, self.probs = self._check_mode_probs(mode_probs)
        if noise_std < 0:
            raise ValueError(f'noise_std must be >= 0, got {noise_std}')
        if group_size < 1:
            raise ValueError(f'group_size must be >= 1, got {group_size}')
        self.noise_std = noise_std
        self.group_size = group_size
        #: E_t as given (``None``: the detector's, or none)
        self.prior_source = prior
        self.dataset_prior = None
        #: class names of ``dataset_prior``'s order (``None``: unnamed)
        self.prior_classes = None
        self._load_dataset_prior(prior, classes)
        self._classes_checked = classes is not None
        self._rng = np.random.default_rng(seed) if seed is not None \
            else None

    def _load_dataset_prior(self, prior, classes=None) -> None:
        """Load E_t (``None``: none yet)."""
        self._prior_name = describe_prior_source(prior)
        if prior is None:
            return
        self.dataset_prior, meta = load_prior_source(
            prior,
            classes=classes,
            num_classes=self.num_classes,
            return_meta=True)
        self.prior_classes = meta['classes']
        num_images = meta.get('num_images') if isinstance(meta, dict) \
            else None
        self._dataset_images = int(num_images) \
            if isinstance(num_images, (int, np.integer)) else None

    def _check_ready(self, need_prior: bool = True) -> None:
        """Raise if K (or, with ``need_prior``, a needed E_t) was given
        nowhere."""
        if self.num_classes is None:
            raise ValueError(
                'EdgeSampler: num_classes is not set; give it, or use the '
                'sampler in a CaliDet detector, which passes its head\'s')
        if self.dataset_prior is not None and \
                self.dataset_prior.shape[0] != self.num_classes:
            raise ValueError(
                f'EdgeSampler: {self._prior_name} has K='
                f'{self.dataset_prior.shape[0]} classes, expected '
                f'num_classes={self.num_classes}')
        needing = [m for m in self.NEED_PRIOR if m in self.modes]
        if need_prior and needing and self.dataset_prior is None:
            raise ValueError(
                f'EdgeSampler: the "{needing[0]}" mode needs a prior (E_t): '
                "give the detector's prior (model.prior) or the sampler's")

    def use_detector_defaults(self,
                              num_classes: int,
                              prior=None,
                              classes: Optional[Sequence[str]] = None,
                              where: str = 'EdgeSampler') -> None:
        """Take K and E_t from the detector where they were not given.

        Args:
            num_classes (int): the head's K.
            prior (optional): the detector's ``prior`` argument (E_t);
                ``None``: the detector has none.
            classes (Sequence[str], optional): the detector's class names,
                to reorder a named prior.
            where (str): how to name this sampler in an error.

        Raises:
            ValueError: a value given here differs from the detector's
                (naming both), or K is given nowhere.
        """
        if self.num_classes is None:
            self.num_classes = num_classes
        elif self.num_classes != num_classes:
            raise ValueError(
                f'{where} has num_classes={self.num_classes} but '
                f'model.bbox_head.num_classes={num_classes}; leave the '
                "sampler's num_classes out to use the head's")
        if prior is not None:
            if self.prior_source is None:
                self.prior_source = prior
                self._load_dataset_prior(prior, classes)
                self._classes_checked = self._classes_checked or \
                    classes is not None
            elif not self._same_prior(prior, classes):
                raise ValueError(
                    f'{where} has prior={_shown(self.prior_source)} but '
                    f'model.prior={_shown(prior)}; give the training prior '
                    "E_t once, as model.prior (leave the sampler's out)")
        # a detector without a prior (E0 at deployment) still builds; its
        # training stops at the first batch if a mode needs E_t
        self._check_ready(need_prior=False)

    def _same_prior(self, prior, classes=None) -> bool:
        """Whether the detector's ``prior`` is this sampler's E_t."""
        if isinstance(prior, (str, os.PathLike)) and \
                isinstance(self.prior_source, (str, os.PathLike)) and \
                os.fspath(prior) == os.fspath(self.prior_source):
            return True
        matrix, meta = load_prior_source(
            prior,
            classes=classes,
            num_classes=self.num_classes,
            return_meta=True)
        if meta['classes'] is not None and self.prior_classes is not None \
                and meta['classes'] != self.prior_classes:
            return False
        return matrix.shape == self.dataset_prior.shape and \
            np.array_equal(matrix, self.dataset_prior)

    def prior_in_order(self, classes: Sequence[str]) -> Optional[np.ndarray]:
        """The dataset prior reordered by name to ``classes``.

        Args:
            classes (Sequence[str]): the dataset's class names.

        Returns:
            np.ndarray | None: the reordered K x K matrix, ``None`` when
            there is nothing to reorder (no prior, an unnamed matrix, or
            already in this order).

        Raises:
            ValueError: the prior's class names are not the dataset's.
        """
        classes = list(classes)
        if self.prior_classes is None or self.prior_classes == classes:
            return None
        try:
            return reorder_prior(self.dataset_prior, self.prior_classes,
                                 classes)
        except ValueError as exc:
            raise ValueError(
                f'EdgeSampler: the class names of {self._prior_name} do not '
                f"match the dataset's classes: {exc}") from exc

    def set_classes(self, classes: Sequence[str]) -> None:
        """Reorder a named dataset prior to the dataset's class order.

        Args:
            classes (Sequence[str]): the dataset's class names.

        Raises:
            ValueError: the prior's class names are not the dataset's
                (the sampler is left unchanged).
        """
        matrix = self.prior_in_order(classes)
        if matrix is not None:
            self.dataset_prior = matrix
            self.prior_classes = list(classes)
        self._classes_checked = True

    def _match_training_classes(self) -> None:
        """A named E_t never matched to the dataset's classes: take the
        classes a Runner trains on, else (a model built outside a Runner,
        as mmdet's own tests build one) warn once and read E_t in its own
        class order, as mmdet's ``init_detector`` reads COCO's for a model
        without classes.

        Raises:
            ValueError: the training dataset's class names are not the
                prior's.
        """
        classes = training_dataset_classes(self.num_classes)
        if classes is not None:
            self.set_classes(classes)
            return
        warnings.warn(
            f'EdgeSampler: {self._prior_name} names its classes, but no '
            'dataset classes reached it: reading it in its own class order '
            "(train with PriorClassesHook, or call set_classes(), to match "
            'it by name)')
        self._classes_checked = True

    def forward(self, inputs: Tensor,
                data_samples: SampleList) -> Tuple[Tensor, SampleList]:
        """Attach ``prior`` and ``sample_prior`` to every data sample.

        Args:
            inputs (Tensor): the batch images (unchanged).
            data_samples (list[DetDataSample]): the batch's data samples.

        Returns:
            tuple: ``(inputs, data_samples)``.
        """
        self._check_ready()
        if not self._classes_checked and self.prior_classes is not None:
            self._match_training_classes()
        labels = [
            ds.gt_instances.labels.detach().cpu().numpy().astype(np.int64)
            for ds in data_samples
        ]
        mode, noise_seed = self._draw()
        label_lists, offset = labels, 0
        if self.batch_scope == 'global' and get_world_size() > 1:
            gathered = all_gather_object((labels, mode, noise_seed))
            _, mode, noise_seed = gathered[0]
            label_lists = [lab for rank in gathered for lab in rank[0]]
            offset = sum(len(rank[0]) for rank in gathered[:get_rank()])
        if self.support or 'sim_site' in self.modes:
            self._add_to_site_bank(label_lists)
        priors = self.sample_priors(mode, label_lists, noise_seed)
        priors = priors[offset:offset + len(labels)]
        support = self.sample_support(mode, label_lists, noise_seed) \
            if self.support else None
        stats = label_lists_prior(labels, self.num_classes)
        priors = torch.from_numpy(priors.astype(np.float32)).to(inputs.device)
        stats = torch.from_numpy(stats.astype(np.float32)).to(inputs.device)
        for k, ds in enumerate(data_samples):
            ds.prior = priors[k]
            ds.sample_prior = stats[k]
            if support is not None:
                ds.prior_support = torch.from_numpy(
                    support[0][offset + k].astype(np.float32)).to(
                        inputs.device)
                ds.prior_marginals = torch.from_numpy(
                    support[1][offset + k].astype(np.float32)).to(
                        inputs.device)
            ds.set_metainfo(dict(prior_mode=mode))
        return inputs, data_samples


def _shown(prior) -> str:
    """A prior argument in an error message: the file or name, else its
    kind."""
    if isinstance(prior, (str, os.PathLike)):
        return repr(os.fspath(prior))
    return f'<{type(prior).__name__}>'
