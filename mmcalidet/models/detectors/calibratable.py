# Copyright (c) mmcalidet contributors. All rights reserved.
"""The mixin that makes a detector calibratable (CaliDet)."""
import contextlib
import contextvars
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures import OptSampleList, SampleList
from torch import Tensor, nn

from ...priors import flat_prior, model_classes, training_dataset_classes
from ...priors.prior import Prior
from ..data_preprocessors import EdgeSampler
from ..non_finite import NonFiniteLossesMixin
from .prior_state import PriorState, load_checkpoint_prior, save_prior_support
from .sample_priors import sample_priors, sample_supports

# set inside defer_class_matching(): dataset_meta is stored, not matched
_DEFER_CLASS_MATCHING = contextvars.ContextVar(
    'mmcalidet_defer_class_matching', default=False)


@contextlib.contextmanager
def defer_class_matching():
    """Within this block, setting a CaliDet detector's ``dataset_meta``
    does not match its named priors to the classes (the first
    ``dataset_meta`` set after the block does): for a builder that sets
    placeholder classes, as mmdet's ``init_detector`` sets COCO's."""
    token = _DEFER_CLASS_MATCHING.set(True)
    try:
        yield
    finally:
        _DEFER_CLASS_MATCHING.reset(token)


class CalibratableDetectorMixin(NonFiniteLossesMixin):
    """A detector whose classification follows an injected prior E
    (CaliDet): ``class CaliX(CalibratableDetectorMixin, X)`` with a
    calibrated head; a DETR takes :class:`CalibratableDETRMixin`, one- and
    two-stage detectors :class:`CalibratableSingleStageMixin` and
    :class:`CalibratableTwoStageMixin`.

    The deployment prior is one :class:`~mmcalidet.priors.Prior`: its
    matrix is the ``prior`` buffer (a checkpoint's ``prior``), its class
    names and support are :attr:`prior_state`'s (a named prior given
    before the classes are known is matched to them by name when they
    arrive; a checkpoint's support is read or refused there). V' is cached
    until the prior or the CaliFormer changes. A data sample's ``prior``
    overrides it for that image (:mod:`.sample_priors`). A non-finite loss
    stops training (:class:`NonFiniteLossesMixin`).

    Args:
        prior (Prior | str | PathLike | array-like | dict, optional): E_t
            and the initial deployment prior: a prior file, a shipped name
            (e.g. ``'coco2017_train'``) or a K x K matrix; ``None``: E0. A
            checkpoint's replaces it. EdgeSamplers that give none take it
            (and the head's K).
        classes (Sequence[str], optional): the model's class names, to
            order named priors by while it has no ``dataset_meta``.
        *args, **kwargs: the arguments of the detector.
    """

    def __init__(self,
                 *args,
                 prior=None,
                 classes: Optional[Sequence[str]] = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self.calibrated_head, 'get_cali_vectors'):
            raise TypeError(f'{type(self).__name__} needs a calibrated '
                            'bbox_head (e.g. CaliDINOHead), got '
                            f'{type(self.calibrated_head).__name__}')
        self.classes = list(classes) if classes is not None else None
        value, pending = self._make_prior(prior, self.classes)
        for i, sampler in self.edge_samplers():
            sampler.use_detector_defaults(
                self.num_classes, prior, classes=self.classes,
                where=f'model.data_preprocessor.batch_augments[{i}] '
                '(EdgeSampler)')
        self.register_buffer('prior',
                             torch.from_numpy(np.array(value.matrix)).float())
        #: the deployment prior's class names and support
        self.prior_state = PriorState(value, pending)
        self._cali_cache: Optional[Tuple[tuple, Tensor]] = None
        # a checkpoint keeps the support beside the prior, and its prior
        # is validated, for every way of loading (prior_state.py)
        self.register_state_dict_post_hook(save_prior_support)
        self.register_load_state_dict_pre_hook(load_checkpoint_prior)

    @property
    def calibrated_head(self) -> nn.Module:
        """The head that owns the CaliFormer: the ``bbox_head``."""
        return self.bbox_head

    @property
    def num_classes(self) -> int:
        """K, the number of classes."""
        return self.calibrated_head.num_classes

    @property
    def reads_prior_support(self) -> bool:
        """Whether the CaliFormer reads a prior's support (experimental)."""
        califormer = self.calibrated_head.califormer
        return bool(
            getattr(califormer, 'use_support_features', False)
            or getattr(califormer, 'use_lift_bias', False))

    # the prior value ------------------------------------------------
    def _make_prior(self, src, classes) -> Tuple[Prior, bool]:
        """``(prior, pending)``: the prior ``src`` names, in the order of
        ``classes`` where given; ``pending``: named, the model's classes
        unknown (it keeps its file's order)."""
        if src is None:
            return Prior(flat_prior(self.num_classes), name='E0'), False
        prior = Prior.load(src, classes=classes, num_classes=self.num_classes)
        return prior, classes is None and prior.classes is not None

    def resolve(self, prior, classes: Optional[Sequence[str]] = None) -> Prior:
        """A prior validated for this model (matrix, names, support; in the
        model's class order), without changing the model: what
        :meth:`set_prior`, the inference APIs and the export check first.

        Raises:
            ValueError: naming the problem (file, shape, K, values, class
                names, support).
        """
        return self._make_prior(prior, classes or model_classes(self))[0]

    def resolve_prior(self, prior, classes=None) -> np.ndarray:
        """The matrix of :meth:`resolve` (K x K float64)."""
        return np.array(self.resolve(prior, classes).matrix)

    def set_prior(self,
                  prior,
                  classes: Optional[Sequence[str]] = None,
                  support=None,
                  marginals=None) -> None:
        """Inject a new deployment prior (no parameter changes); a bad one
        raises and leaves the previous one.

        Args:
            prior (Prior | str | PathLike | array-like | dict | Tensor): a
                prior file, shipped name, dict, K x K matrix or ``Prior``;
                ``None``: E0.
            classes (Sequence[str], optional): the order to reorder a named
                prior to; default the model's classes.
            support, marginals (array-like, optional): experimental: (K,)
                the images each column was measured on and each class's
                share of them (both or neither); default the prior's.
        """
        value, pending = self._make_prior(prior,
                                          classes or model_classes(self))
        if support is not None or marginals is not None:
            value = value.with_support(support, marginals)
        self._adopt(value, pending)

    def _adopt(self, value: Prior, pending: bool) -> None:
        with torch.no_grad():
            self.prior.copy_(torch.from_numpy(np.array(value.matrix)))
        self.prior_state.set(value, pending)
        self._cali_cache = None

    def get_prior(self) -> np.ndarray:
        """The deployment prior's matrix, K x K float64 (a copy)."""
        return self.prior.detach().cpu().double().numpy()

    def current_prior(self) -> Prior:
        """The deployment prior: the buffer's matrix, names and support."""
        value = self.prior_state.value
        return Prior(self.get_prior(), value.classes,
                     *(value.support_pair() or (None, None)),
                     meta=value.meta, name=value.name)

    def deployment_support(self) -> Tuple[Optional[Tensor], ...]:
        """The deployment prior's (support, marginals), (K,) each on the
        prior's device, for a CaliFormer that reads them; else
        ``(None, None)``."""
        if not self.reads_prior_support:
            return None, None
        return self.prior_state.support_tensors(self.prior.device)

    @property
    def prior_support(self) -> Optional[Tensor]:
        """(K,) the images each prior column was measured on, or None."""
        return self.deployment_support()[0]

    @property
    def prior_marginals(self) -> Optional[Tensor]:
        """(K,) each class's share of them, or None."""
        return self.deployment_support()[1]

    # class names ------------------------------------------------------
    @property
    def dataset_meta(self) -> dict:
        """The dataset's meta, as mmengine's runner and mmdet's
        ``init_detector`` set it; the first ``classes`` set match the named
        priors (:meth:`match_prior_classes`)."""
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
        ``classes``, once (:meth:`PriorState.match`).

        Raises:
            ValueError: a named prior's class names are not ``classes``.
        """
        value = self.prior_state.match(classes, self.edge_samplers())
        if value is not None:
            self._adopt(value, pending=False)

    def edge_samplers(self) -> List[Tuple[int, EdgeSampler]]:
        """The EdgeSamplers among the data preprocessor's batch augments,
        with their index."""
        augments = getattr(self.data_preprocessor, 'batch_augments', None)
        return [(i, aug) for i, aug in enumerate(augments or [])
                if isinstance(aug, EdgeSampler)]

    def check_classes_matched(self) -> None:
        """Before training on a named prior in its file's order: match it
        to the classes a Runner trains on, else (a model built outside a
        Runner, as mmdet's own tests build one) warn once and read it in
        its own order (:meth:`PriorState.own_order`).

        Raises:
            ValueError: the training classes' names are not the prior's.
        """
        if self.prior_state.pending and not self.prior_state.matched:
            classes = training_dataset_classes(self.num_classes)
            if classes is not None:
                self.match_prior_classes(classes)
            self.prior_state.own_order()

    # V' -------------------------------------------------------------------
    def _cache_key(self) -> tuple:
        califormer = self.calibrated_head.califormer
        tensors = [self.prior, *califormer.parameters(), *califormer.buffers()]
        tensors += [t for t in self.deployment_support() if t is not None]
        return tuple((t.data_ptr(), t._version) for t in tensors)

    def deployment_cali_vectors(self) -> Tensor:
        """V' of the deployment prior (K x d), cached while gradients are
        off and neither the prior nor the CaliFormer changes."""
        support, marginals = self.deployment_support()
        head = self.calibrated_head
        if torch.is_grad_enabled():
            return head.get_cali_vectors(self.prior, support, marginals)
        key = self._cache_key()
        if self._cali_cache is None or self._cali_cache[0] != key:
            cali = head.get_cali_vectors(self.prior, support, marginals)
            self._cali_cache = (key, cali)
        return self._cali_cache[1]

    def batch_priors(self, samples: OptSampleList) -> Optional[Tensor]:
        """The (B, K, K) per-sample priors, or ``None`` (all deployment)."""
        return sample_priors(samples, self.prior, self.num_classes)

    def batch_support(self, samples: OptSampleList) -> Tuple:
        """The per-sample (support, marginals), (B, K) each or ``None``."""
        return sample_supports(samples, self.deployment_support(), self.prior)

    def calibration_inputs(self, batch_data_samples: OptSampleList,
                           batch_size: int) -> Dict[str, Tensor]:
        """What the calibrated head needs beside its features:
        ``cali_vectors`` (V': K x d, or B x K x d with per-sample priors)
        and, in training, the ``priors`` (B x K x K) LoMa compares with
        each image's statistics."""
        priors = self.batch_priors(batch_data_samples)
        if priors is None:
            inputs = dict(cali_vectors=self.deployment_cali_vectors())
        else:
            inputs = dict(
                cali_vectors=self.calibrated_head.get_cali_vectors(
                    priors, *self.batch_support(batch_data_samples)))
        if self.training:
            if priors is None:
                priors = self.prior.expand(batch_size, -1, -1)
            inputs['priors'] = priors
        return inputs

    def loss(self, batch_inputs: Tensor,
             batch_data_samples: SampleList) -> dict:
        """The detector's losses on images, once a named prior is in the
        training classes' order (:meth:`check_classes_matched`)."""
        if isinstance(batch_inputs, dict):  # an older calibrator config
            raise TypeError(
                'cached decoder outputs train a CachedCalibration model: '
                "model.type='CachedCalibration', detector="
                f'{type(self).__name__!r} (configs/_base_/calibrator.py)')
        self.check_classes_matched()
        return super().loss(batch_inputs, batch_data_samples)
