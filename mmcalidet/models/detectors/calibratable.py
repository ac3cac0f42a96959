# Copyright (c) mmcalidet contributors. All rights reserved.
"""The mixin that makes a detector calibratable (CaliDet)."""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures import OptSampleList, SampleList
from torch import Tensor, nn

from ...priors import (describe_prior_source, flat_prior, load_prior_source,
                       model_classes)
from ...priors.file_support import support_from_meta
from ..layers.support_ops import check_support
from ..non_finite import NonFiniteLossesMixin
from .prior_buffer import PriorBufferMixin
from .prior_classes import defer_class_matching  # noqa: F401 (its old home)
from .prior_classes import PriorClassesMixin


class CalibratableDetectorMixin(PriorBufferMixin, PriorClassesMixin,
                                NonFiniteLossesMixin):
    """A detector whose classification follows an injected prior E
    (CaliDet). For a DETR: ``class CaliX(CalibratableDetectorMixin, X)``,
    where ``X.forward_transformer`` returns ``hidden_states`` (L, B, Q, d)
    and the ``bbox_head`` is a ``CalibratedClsMixin`` head; one-stage
    and two-stage detectors take :class:`CalibratableSingleStageMixin` and
    :class:`CalibratableTwoStageMixin`.

    The model holds a deployment prior (the buffer ``prior``) and caches
    its V' until the prior or the CaliFormer changes. A data sample's
    ``prior`` (K x K) overrides it for that sample (oracle evaluation,
    multi-site batches, the EdgeSampler's training priors); it only reaches
    the head's classification. Named priors are matched to the model's
    classes (:class:`PriorClassesMixin`); the buffer's checkpoint state and
    a prior's support are :class:`PriorBufferMixin`'s; a non-finite loss
    stops training (:class:`NonFiniteLossesMixin`). Calibrator training on
    cached decoder outputs is the ``CachedCalibration`` model type.

    Args:
        prior (str | PathLike | array-like | dict, optional): the training
            prior E_t and the initial deployment prior: a prior file, the
            name of a shipped prior (e.g. ``'coco2017_train'``) or a K x K
            matrix; ``None``: the flat prior E0. A checkpoint's replaces
            it. EdgeSamplers that give none take it (and the head's K).
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
        matrix, self._pending_prior, support = self._load_named_prior(prior)
        self._configure_edge_samplers(prior)
        self.register_buffer('prior', torch.from_numpy(matrix).float())
        self._cali_cache: Optional[Tuple[tuple, Tensor]] = None
        # a support-aware CaliFormer: E_t with the support its file records
        self._set_support(support)
        if self._pending_prior is not None and self.reads_prior_support:
            self.__dict__['_pending_support_source'] = prior

    @property
    def calibrated_head(self) -> nn.Module:
        """The head that owns the CaliFormer: the ``bbox_head``."""
        return self.bbox_head

    @property
    def num_classes(self) -> int:
        """K, the number of classes."""
        return self.calibrated_head.num_classes

    def _load_named_prior(self, prior, classes=None) -> tuple:
        """The prior in the model's class order; ``(name, class names)``
        of a named prior that could not be ordered yet because the model's
        classes are unknown (else ``None``); and the (support, class
        shares) its file records, for a model that reads them and knows its
        classes (else ``None``)."""
        if prior is None:
            return flat_prior(self.num_classes), None, None
        if classes is None:
            classes = model_classes(self)
        matrix, meta = load_prior_source(prior, classes=classes,
                                         num_classes=self.num_classes,
                                         return_meta=True)
        pending = None
        if classes is None and meta['classes'] is not None:
            pending = (describe_prior_source(prior), list(meta['classes']))
        support = None
        if self.reads_prior_support and classes is not None:
            support = support_from_meta(meta, list(classes),
                                        describe_prior_source(prior))
        return matrix, pending, support

    def resolve_prior(self,
                      prior,
                      classes: Optional[Sequence[str]] = None) -> np.ndarray:
        """Validate a prior for this model without changing the model:
        what :meth:`set_prior` does before it changes anything (the
        inference APIs check a call's priors with it before the model
        runs).

        Returns:
            np.ndarray: the validated K x K float64 matrix in the model's
            class order.

        Raises:
            ValueError: naming the problem (file, shape, K, values, class
                names).
        """
        return self._load_named_prior(prior, classes)[0]

    def set_prior(self,
                  prior,
                  classes: Optional[Sequence[str]] = None,
                  support=None,
                  marginals=None) -> None:
        """Inject a new deployment prior (no parameter changes).

        The prior is validated (and reordered by class name) before
        anything changes, so an invalid prior leaves the previous one.

        Args:
            prior (str | PathLike | array-like | dict | Tensor): a prior
                file, shipped name, dict or K x K matrix; ``None`` for E0.
            classes (Sequence[str], optional): the order to reorder a named
                prior to; defaults to ``dataset_meta['classes']`` or the
                ``classes`` given at construction.
            support, marginals (array-like, optional): experimental: the
                (K,) images each column was measured on and the share of
                them holding each class, in the model's class order, for a
                CaliFormer that reads them (:class:`PriorBufferMixin`);
                ``None``: what the prior file records, else none.
        """
        matrix, pending, recorded = self._load_named_prior(prior, classes)
        if support is None and marginals is None and recorded is not None:
            support, marginals = recorded
        k = self.num_classes
        extra = {}
        for name, values in (('support', support), ('marginals', marginals)):
            if values is not None:
                values = torch.as_tensor(values, dtype=torch.float32)
                check_support(values, 1, k, name, values)
                values = values.to(self.prior.device)
            extra[name] = values
        with torch.no_grad():
            self.prior.copy_(torch.from_numpy(matrix))
        self.prior_support, self.prior_marginals = extra['support'], \
            extra['marginals']
        self._cali_cache = None
        self._pending_prior = pending

    def get_prior(self) -> np.ndarray:
        """The deployment prior, a K x K float64 array (a copy)."""
        return self.prior.detach().cpu().double().numpy()

    def _cache_key(self) -> tuple:
        califormer = self.calibrated_head.califormer
        tensors = [self.prior, *califormer.parameters(), *califormer.buffers()]
        tensors += [t for t in self.deployment_support() if t is not None]
        return tuple((t.data_ptr(), t._version) for t in tensors)

    def deployment_cali_vectors(self) -> Tensor:
        """V' of the deployment prior (K x d).

        Cached while gradients are off and neither the prior nor the
        CaliFormer changes (an in-place update, a load or a move of either
        invalidates the cache).
        """
        support, marginals = self.deployment_support()
        head = self.calibrated_head
        if torch.is_grad_enabled():
            return head.get_cali_vectors(self.prior, support, marginals)
        key = self._cache_key()
        if self._cali_cache is None or self._cali_cache[0] != key:
            cali = head.get_cali_vectors(self.prior, support, marginals)
            self._cali_cache = (key, cali)
        return self._cali_cache[1]

    def batch_priors(self,
                     batch_data_samples: OptSampleList) -> Optional[Tensor]:
        """The (B, K, K) per-sample priors of a batch (a sample without a
        ``prior`` gets the deployment prior), or ``None`` if no data sample
        has one (then the deployment prior applies to all)."""
        if not batch_data_samples:
            return None
        found = [ds.get('prior', None) for ds in batch_data_samples]
        if all(p is None for p in found):
            return None
        k = self.num_classes
        priors = []
        for p in found:
            p = self.prior if p is None else torch.as_tensor(
                p, dtype=self.prior.dtype, device=self.prior.device)
            if p.shape != (k, k):
                raise ValueError(f'a data sample prior must be {k} x {k}, '
                                 f'got {tuple(p.shape)}')
            priors.append(p)
        return torch.stack(priors)

    def calibration_inputs(self, batch_data_samples: OptSampleList,
                           batch_size: int) -> Dict[str, Tensor]:
        """What the calibrated head needs beside its features:
        ``cali_vectors`` (V': K x d, or B x K x d with per-sample priors)
        and, in training, the ``priors`` (B x K x K) that LoMa compares
        with each image's statistics."""
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

    def forward_transformer(self,
                            img_feats: Tuple[Tensor],
                            batch_data_samples: OptSampleList = None) -> Dict:
        """The detector's transformer, then the calibration vectors for the
        head (:meth:`calibration_inputs`); ``loss``, ``predict`` and
        ``_forward`` pass them on to the head."""
        head_inputs_dict = super().forward_transformer(img_feats,
                                                       batch_data_samples)
        batch_size = head_inputs_dict['hidden_states'].shape[1]
        head_inputs_dict.update(
            self.calibration_inputs(batch_data_samples, batch_size))
        return head_inputs_dict

    def loss(self, batch_inputs: Tensor,
             batch_data_samples: SampleList) -> dict:
        """The detector's losses on images, once a named prior was matched
        to the training classes (:meth:`check_classes_matched`)."""
        if isinstance(batch_inputs, dict):  # an older calibrator config
            raise TypeError(
                'cached decoder outputs train a CachedCalibration model: '
                "model.type='CachedCalibration', detector="
                f'{type(self).__name__!r} (configs/_base_/calibrator.py)')
        self.check_classes_matched()
        return super().loss(batch_inputs, batch_data_samples)
