# Copyright (c) mmcalidet contributors. All rights reserved.
"""A CaliDet detector's prior buffer in checkpoints, and its support.

A checkpoint's prior is validated like a prior file when it is loaded. A
CaliFormer with ``support_features`` or ``lift_bias`` also reads what a
prior was measured on: the (K,) images each column counts (its support n)
and the share of them holding each class. The detector keeps them beside
its deployment prior, in checkpoints too, and per sample in a batch.
"""
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.structures import OptSampleList
from torch import Tensor

from ...priors import validate_prior
from ...utils.checkpoint_compat import InvalidCheckpointPriorError
from ..layers.support_ops import check_support


class PriorBufferMixin:
    """The ``prior`` buffer's checkpoint state, and the deployment prior's
    (support, marginals) and a batch's (experimental); a base of
    :class:`~mmcalidet.models.detectors.CalibratableDetectorMixin`, which
    registers the buffer, loads priors (``_load_named_prior``) and names
    the head that owns the CaliFormer (``calibrated_head``).
    """

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
        self._load_support(state_dict, prefix, value)
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _load_support(self, state_dict: dict, prefix: str,
                      value: Optional[Tensor]) -> None:
        """Take the support a checkpoint saved beside its prior ``value``
        (popped from ``state_dict``), or drop the known one when the
        checkpoint's prior is another.

        Raises:
            ValueError: a saved support of the wrong shape or values.
        """
        saved = [state_dict.pop(prefix + n, None) for n in self._SUPPORT_KEYS]
        if value is None or \
                tuple(getattr(value, 'shape', ())) != tuple(self.prior.shape):
            return
        if all(t is not None for t in saved):
            for name, t in zip(self._SUPPORT_KEYS, saved):
                check_support(t, 1, self.num_classes,
                              f'checkpoint {prefix}{name}', t)
            self._set_support(saved)
        elif not torch.equal(
                torch.as_tensor(value).to(self.prior), self.prior):
            # another prior than the one whose support is known here
            self._set_support(None)

    @property
    def reads_prior_support(self) -> bool:
        """Whether the CaliFormer reads a prior's support
        (``support_features`` or ``lift_bias``, experimental)."""
        califormer = self.calibrated_head.califormer
        return bool(
            getattr(califormer, 'use_support_features', False)
            or getattr(califormer, 'use_lift_bias', False))

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
