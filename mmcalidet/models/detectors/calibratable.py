# Copyright (c) mmcalidet contributors. All rights reserved.
"""Prior plumbing shared by the CaliDet detectors."""
import contextlib
import contextvars
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures import OptSampleList, SampleList
from torch import Tensor

from ...priors import (describe_prior_source, flat_prior, load_prior_source,
                       model_classes, reorder_prior, training_dataset_classes,
                       validate_prior)
from ...priors.file_support import support_from_meta
from ...utils.checkpoint_compat import InvalidCheckpointPriorError
from ..data_preprocessors import EdgeSampler, is_cached_batch
from ..layers.support_ops import check_support
from ..non_finite import (NonFiniteError, check_finite_losses,
                          non_finite_sources)

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


class CalibratableDetectorMixin:
    """A DETR-family detector whose classification follows an injected
    prior E (CaliDet). Put it before the detector class:
    ``class CaliX(CalibratableDetectorMixin, X)``; ``X.forward_transformer``
    must return the head inputs with ``hidden_states`` (L, B, Q, d).

    The model holds a deployment prior (the buffer ``prior``, saved in
    checkpoints) and caches its calibration vectors V' for inference until
    the prior or the CaliFormer changes. A ``prior`` field (K x K tensor or
    array) in a data sample overrides the deployment prior for that sample
    (oracle evaluation, multi-site batches, and the EdgeSampler's training
    priors). The prior only reaches the head's classification: backbone,
    transformer, proposals and boxes do not depend on it.

    A named prior (a prior file or shipped name with class names) loaded
    while the model's classes are unknown is matched to them by name, once:
    when ``dataset_meta`` is first set (``init_detector``, the tools), or
    at the first training step from the running training loop's dataset
    (mmengine's runner does not set ``dataset_meta``): reordered to the
    dataset's class order, or rejected with a ``ValueError`` naming the
    file when the names differ. The same holds for the prior of each
    EdgeSampler in the data preprocessor (which checks at its first
    batch). A checkpoint's prior is in the model's order already.

    Args:
        prior (str | PathLike | array-like | dict, optional): the training
            prior E_t and the initial deployment prior: a prior file, the
            name of a shipped prior (e.g. ``'coco2017_train'``) or a K x K
            matrix. ``None`` gives the flat prior E0 (and no E_t). A
            checkpoint's ``prior`` replaces it on load. The EdgeSamplers of
            the data preprocessor that give no ``prior`` (and no
            ``num_classes``) take it (and the head's ``num_classes``).
        classes (Sequence[str], optional): the model's class names, to
            reorder named prior files when the model has no
            ``dataset_meta``.
        cache_train_cls_branches (bool): in training on cached decoder
            outputs (:meth:`loss_cached`), let the decoder layers'
            classification branches learn too; by default only the
            CaliFormer does. Defaults to False.
        *args, **kwargs: the arguments of the detector; ``bbox_head``
            must be a calibrated head (:class:`CalibratedClsMixin`).
    """

    def __init__(self,
                 *args,
                 prior=None,
                 classes: Optional[Sequence[str]] = None,
                 cache_train_cls_branches: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache_train_cls_branches = bool(cache_train_cls_branches)
        if not hasattr(self.bbox_head, 'get_cali_vectors'):
            raise TypeError(f'{type(self).__name__} needs a calibrated '
                            'bbox_head (e.g. CaliDINOHead), got '
                            f'{type(self.bbox_head).__name__}')
        self.classes = list(classes) if classes is not None else None
        matrix, self._pending_prior, support = self._load_named_prior(prior)
        self._configure_edge_samplers(prior)
        self.register_buffer('prior', torch.from_numpy(matrix).float())
        self._cali_cache: Optional[Tuple[tuple, Tensor]] = None
        # a support-aware CaliFormer: E_t with the support its file records
        self._set_support(support)
        if self._pending_prior is not None and self.reads_prior_support:
            self.__dict__['_pending_support_source'] = prior

    def _set_support(self, support: Optional[Tuple[Any, Any]]) -> None:
        """Set the deployment prior's (support, marginals), or none."""
        if support is None:
            self.prior_support = self.prior_marginals = None
            return
        self.prior_support, self.prior_marginals = (torch.as_tensor(
            np.asarray(t), dtype=torch.float32).to(self.prior.device)
                                                    for t in support)
        self._cali_cache = None

    _SUPPORT_KEYS = ('prior_support', 'prior_marginals')

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        """The state, plus the deployment prior's support where it has
        one (a support-aware CaliFormer): a checkpoint keeps what E was
        measured on beside E."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in self._SUPPORT_KEYS:
            value = self.__dict__.get(name)
            if value is not None:
                destination[prefix + name] = value if keep_vars else \
                    value.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata,
                              strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """Validate a loaded ``prior`` buffer like a prior file, then load.

        A checkpoint's prior that is not finite, outside [0, 1] or without
        a unit diagonal would give NaN or meaningless scores without any
        error; it is refused here, for every way of loading (mmengine's
        ``load_checkpoint``, the runner, ``load_state_dict``). A prior of
        another shape is left to the usual size-mismatch handling (see
        :func:`~mmcalidet.utils.checkpoint_compat.check_checkpoint`).

        Raises:
            InvalidCheckpointPriorError: naming the problem.
        """
        key = prefix + 'prior'
        value = state_dict.get(key)
        if value is not None and \
                tuple(getattr(value, 'shape', ())) == tuple(self.prior.shape):
            try:
                validate_prior(value, num_classes=self.num_classes)
            except ValueError as exc:
                raise InvalidCheckpointPriorError(
                    f'checkpoint has an invalid prior ({key!r} of '
                    f'{type(self).__name__}): {exc}') from exc
        # a checkpoint's prior is in the model's class order
        if value is not None:
            self._pending_prior = None
            self.__dict__.pop('_pending_support_source', None)
        saved = [state_dict.pop(prefix + n, None) for n in self._SUPPORT_KEYS]
        if value is not None and \
                tuple(getattr(value, 'shape', ())) == tuple(self.prior.shape):
            k = self.num_classes
            if all(t is not None for t in saved):
                for name, t in zip(self._SUPPORT_KEYS, saved):
                    check_support(t, 1, k, f'checkpoint {prefix}{name}', t)
                self._set_support(saved)
            elif not torch.equal(
                    torch.as_tensor(value).to(self.prior), self.prior):
                # another prior than the one whose support is known here
                self._set_support(None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

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
            self._match_prior_classes(list(classes))
        self.__dict__['_dataset_meta'] = meta

    def _match_prior_classes(self, classes: List[str]) -> None:
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

    @property
    def num_classes(self) -> int:
        """K, the number of classes."""
        return self.bbox_head.num_classes

    @property
    def reads_prior_support(self) -> bool:
        """Whether the CaliFormer reads a prior's support
        (``support_features`` or ``lift_bias``, experimental)."""
        califormer = self.bbox_head.califormer
        return bool(
            getattr(califormer, 'use_support_features', False)
            or getattr(califormer, 'use_lift_bias', False))

    def _load_named_prior(
        self,
        prior,
        classes=None
    ) -> Tuple[np.ndarray, Optional[Tuple[str, List[str]]], Optional[Tuple[
            np.ndarray, np.ndarray]]]:
        """The prior in the model's class order; ``(name, class names)``
        of a named prior that could not be ordered yet because the model's
        classes are unknown (else ``None``); and the (support, class
        shares) its file records, for a model that reads them and knows its
        classes (else ``None``)."""
        if prior is None:
            return flat_prior(self.num_classes), None, None
        if classes is None:
            classes = model_classes(self)
        matrix, meta = load_prior_source(
            prior,
            classes=classes,
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

    def _load_prior(self, prior, classes=None) -> np.ndarray:
        return self._load_named_prior(prior, classes)[0]

    def resolve_prior_support(
            self,
            prior,
            classes: Optional[Sequence[str]] = None
    ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The (support, class shares) that a prior file (or dict)
        records, in the model's class order, for a model whose CaliFormer
        reads them (see :mod:`mmcalidet.priors.file_support`).

        Args:
            prior: a prior file, shipped name, dict or matrix.
            classes (Sequence[str], optional): as :meth:`set_prior`'s.

        Returns:
            tuple[np.ndarray, np.ndarray] | None: (K,) n and (K,) p, or
            ``None`` (a model that reads no support, a matrix, or a file
            that records none).
        """
        if prior is None or not self.reads_prior_support:
            return None
        return self._load_named_prior(prior, classes)[2]

    def resolve_prior(self,
                      prior,
                      classes: Optional[Sequence[str]] = None) -> np.ndarray:
        """Validate a prior for this model without changing the model.

        What :meth:`set_prior` does before it changes anything; the
        inference APIs use it to check a call's priors before the model
        runs.

        Args:
            prior (str | PathLike | array-like | dict | Tensor): a prior
                file, shipped name, dict or K x K matrix; ``None`` for E0.
            classes (Sequence[str], optional): the order to reorder a named
                prior to (see :meth:`set_prior`).

        Returns:
            np.ndarray: the validated K x K float64 matrix in the model's
            class order.

        Raises:
            ValueError: naming the problem (file, shape, K, values, class
                names).
        """
        return self._load_prior(prior, classes)

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
            support (array-like, optional): experimental: the
                (K,) images each column was measured on, read by a
                CaliFormer with ``support_features`` / ``lift_bias``.
                ``None``: what the prior file records (``num_images``,
                :func:`~mmcalidet.priors.file_support.support_from_meta`),
                else no support (today's V'). In the model's class order.
            marginals (array-like, optional): experimental: the (K,)
                share of those images holding each class (``None``: the
                file's ``images_per_class`` / ``num_images``, with
                ``support``).
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
        self.prior_support = extra['support']
        self.prior_marginals = extra['marginals']
        self._cali_cache = None
        self._pending_prior = pending

    def get_prior(self) -> np.ndarray:
        """The deployment prior, a K x K float64 array (a copy)."""
        return self.prior.detach().cpu().double().numpy()

    def deployment_support(self) -> Tuple[Optional[Tensor], ...]:
        """The deployment prior's (support, marginals), each (K,) or
        ``None`` (see :meth:`set_prior`)."""
        out = []
        for name in ('prior_support', 'prior_marginals'):
            value = self.__dict__.get(name)
            if value is not None and value.device != self.prior.device:
                value = value.to(self.prior.device)
                self.__dict__[name] = value
            out.append(value)
        return tuple(out)

    def _cache_key(self) -> tuple:
        califormer = self.bbox_head.califormer
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
        if torch.is_grad_enabled():
            return self.bbox_head.get_cali_vectors(self.prior, support,
                                                   marginals)
        key = self._cache_key()
        if self._cali_cache is None or self._cali_cache[0] != key:
            self._cali_cache = (key,
                                self.bbox_head.get_cali_vectors(
                                    self.prior, support, marginals))
        return self._cali_cache[1]

    def batch_priors(self,
                     batch_data_samples: OptSampleList) -> Optional[Tensor]:
        """The per-sample priors of a batch, or ``None`` if no data sample
        has a ``prior`` (then the deployment prior applies to all).

        Args:
            batch_data_samples (list[DetDataSample], optional): the batch.

        Returns:
            Tensor | None: (B, K, K); samples without a ``prior`` get the
            deployment prior.
        """
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

    def batch_support(
        self, batch_data_samples: OptSampleList
    ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """The per-sample (support, marginals), each (B, K), from the data
        samples' ``prior_support`` / ``prior_marginals`` (experimental:
        the EdgeSampler's ``support=True``, or a prior file's record), or
        ``None`` when no sample's prior has one. A sample without its own
        ``prior`` gets the deployment prior's.

        Raises:
            ValueError: a batch where some priors have a support and others
                none (each row of V' is computed one way).
        """
        samples = batch_data_samples or []
        own_prior = [ds.get('prior', None) is not None for ds in samples]
        out = []
        for field, default in zip(('prior_support', 'prior_marginals'),
                                  self.deployment_support()):
            rows = []
            for ds, own in zip(samples, own_prior):
                v = ds.get(field, None)
                if v is None and not own:
                    v = default
                rows.append(None if v is None else torch.as_tensor(
                    v, dtype=self.prior.dtype, device=self.prior.device))
            if all(v is None for v in rows):
                out.append(None)
                continue
            if any(v is None for v in rows):
                raise ValueError(
                    f'a batch mixes priors with a {field} and priors '
                    'without one: run them in separate batches')
            out.append(torch.stack(rows))
        return out[0], out[1]

    def parse_losses(self, losses: Dict[str, Tensor]) -> tuple:
        """mmengine's ``parse_losses``, then stop if the total loss is not
        finite.

        Args:
            losses (dict[str, Tensor]): the loss terms.

        Returns:
            tuple[Tensor, dict]: the total loss and the terms to log.

        Raises:
            NonFiniteError: naming the iteration and the non-finite terms,
                e.g. ``non-finite loss at iteration 12: loss_cls=nan,
                d0.loss_cls=nan (the others are finite)``.
        """
        loss, log_vars = super().parse_losses(losses)
        check_finite_losses(loss, log_vars)
        return loss, log_vars

    def forward_transformer(self,
                            img_feats: Tuple[Tensor],
                            batch_data_samples: OptSampleList = None) -> Dict:
        """The detector's transformer, then the calibration vectors for the
        head.

        Adds ``cali_vectors`` (V': K x d, or B x K x d with per-sample
        priors) to the head inputs and, in training, the ``priors``
        (B x K x K) that LoMa compares with each image's statistics.
        ``loss``, ``predict`` and ``_forward`` pass them on to the head.
        """
        head_inputs_dict = super().forward_transformer(img_feats,
                                                       batch_data_samples)
        priors = self.batch_priors(batch_data_samples)
        if priors is None:
            head_inputs_dict['cali_vectors'] = self.deployment_cali_vectors()
        else:
            head_inputs_dict['cali_vectors'] = \
                self.bbox_head.get_cali_vectors(
                    priors, *self.batch_support(batch_data_samples))
        if self.training:
            if priors is None:
                batch_size = head_inputs_dict['hidden_states'].shape[1]
                priors = self.prior.expand(batch_size, -1, -1)
            head_inputs_dict['priors'] = priors
        return head_inputs_dict

    def calibrator_modules(self) -> Dict[str, torch.nn.Module]:
        """What a training on cached decoder outputs updates, by name in
        the detector: the CaliFormer and, with
        ``cache_train_cls_branches``, the decoder layers' classification
        branches (not the encoder's proposal classifier)."""
        head = self.bbox_head
        modules = {'bbox_head.califormer': head.califormer}
        if self.cache_train_cls_branches:
            num = len(head.cls_branches) - int(
                bool(getattr(head, 'as_two_stage', False)))
            for layer in range(num):
                modules[f'bbox_head.cls_branches.{layer}'] = \
                    head.cls_branches[layer]
        return modules

    def loss(self, batch_inputs, batch_data_samples: SampleList) -> dict:
        """The detector's losses on images, or :meth:`loss_cached` on
        cached decoder outputs (``dict(hidden_states=..., bbox_preds=...)``
        from :class:`DecoderCachePreprocessor`). At the first step of a
        training run (no ``dataset_meta`` set), the named priors are
        matched to the training dataset's classes first."""
        if not self.__dict__.get('_classes_matched') and \
                '_dataset_meta' not in self.__dict__:
            classes = training_dataset_classes(self.num_classes)
            if classes is not None:
                self._match_prior_classes(classes)
        if is_cached_batch(batch_inputs):
            return self.loss_cached(batch_inputs, batch_data_samples)
        try:
            return super().loss(batch_inputs, batch_data_samples)
        except NonFiniteError as error:
            # name what the forward was computed from: the weights (a
            # diverged run) or the images (a bad input)
            raise NonFiniteError(
                f'{error}; {non_finite_sources(self, batch_inputs)}'
            ) from None

    def loss_cached(self, batch_inputs: Dict[str, Tensor],
                    batch_data_samples: SampleList) -> dict:
        """Calibrator training on cached decoder outputs: the CaliFormer
        (and, with ``cache_train_cls_branches``, the classification
        branches) learn from each sample's prior (the EdgeSampler's draw)
        with the matching, focal and LoMa losses of the calibrated head
        (:meth:`CalibratedClsMixin.loss_cached`).

        Args:
            batch_inputs (dict): ``hidden_states`` (L, B, Q, d) and
                ``bbox_preds`` (L, B, Q, 4).
            batch_data_samples (list[DetDataSample]): with
                ``gt_instances`` (and ``prior`` / ``sample_prior``).

        Returns:
            dict[str, Tensor]: the loss components.
        """
        hidden = batch_inputs['hidden_states']
        priors = self.batch_priors(batch_data_samples)
        support, marginals = self.batch_support(batch_data_samples)
        if priors is None:
            priors = self.prior.expand(hidden.shape[1], -1, -1)
        return self.bbox_head.loss_cached(
            hidden,
            batch_inputs['bbox_preds'],
            batch_data_samples,
            self.bbox_head.get_cali_vectors(priors, support, marginals),
            priors,
            train_cls_branches=self.cache_train_cls_branches)
