# Copyright (c) mmcalidet contributors. All rights reserved.
"""A CaliDet detector's deployment prior: one object the detector holds.

The matrix is the detector's ``prior`` buffer: a checkpoint's ``prior``
key, moved with the model. :class:`PriorState` holds the rest of the
:class:`~mmcalidet.priors.Prior` value (its class names and its support)
and the decisions that need them:

- a named prior given before the model knows its classes stays in its
  file's order (``pending``) until the first classes arrive, then is
  reordered by name with the EdgeSamplers' E_t (:meth:`PriorState.match`);
  a model trained without any warns once and keeps the file's order, as
  mmdet's ``init_detector`` reads COCO's classes for a model without them;
- a checkpoint's prior comes with the support the checkpoint saved beside
  it, or, where it saved none, with the configured prior's support when
  the two matrices agree once the classes are known, else with none; a
  support saved in part or out of range is refused
  (:meth:`PriorState.from_checkpoint`).
"""
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...priors.prior import Prior, class_order
from ...utils.checkpoint_compat import InvalidCheckpointPriorError

#: the state-dict keys of the deployment prior's support (beside 'prior')
SUPPORT_KEYS = ('prior_support', 'prior_marginals')

#: the largest difference between a checkpoint's float32 prior and a
#: file's float64 one that still counts as the same matrix
SAME_MATRIX_ATOL = 1e-6


class PriorState:
    """The deployment prior's class names and support, and whether its
    order is still the file's.

    Args:
        prior (Prior): the deployment prior as given (the detector's
            configured one, E_t, at construction).
        pending (bool): ``prior`` is a named prior in its file's class
            order, the model's classes not known yet.
    """

    def __init__(self, prior: Prior, pending: bool) -> None:
        self.value = prior
        #: the configured prior (E_t), whose support a checkpoint that
        #: saved none takes where its prior is the same matrix
        self.configured = prior
        self.pending = bool(pending)
        #: the model's classes reached it once (later ones do not reorder)
        self.matched = False
        #: a checkpoint's prior whose support waits for the classes
        self.checkpoint_unsupported = False
        self.warned_order = False
        #: the classes a prior read in its own order took for the model's
        self.own_classes: Optional[Tuple[str, ...]] = None
        self._tensors: Optional[tuple] = None

    def set(self, prior: Prior, pending: bool = False) -> None:
        """A new deployment prior (``set_prior``, a class match)."""
        self.value = prior
        self.pending = bool(pending)
        self.checkpoint_unsupported = False

    def support_tensors(self, device) -> Tuple[Optional[Tensor], ...]:
        """The deployment prior's (support, marginals) as (K,) float32
        tensors on ``device`` (made once per prior and device), or
        ``(None, None)``."""
        pair = self.value.support_pair()
        if pair is None:
            return None, None
        cached = self._tensors
        if cached is None or cached[0] is not self.value or \
                cached[1].device != torch.device(device):
            cached = (self.value, *(torch.as_tensor(
                np.array(t), dtype=torch.float32).to(device) for t in pair))
            self._tensors = cached
        return cached[1], cached[2]

    # ------------------------------------------------------------------
    # the model's classes
    def match(self, classes: Sequence[str],
              samplers: Sequence[Tuple[int, object]]) -> Optional[Prior]:
        """Match the deployment prior and the EdgeSamplers' E_t to the
        model's ``classes``, the first time they are known; validate all
        before changing any.

        Args:
            classes (Sequence[str]): the dataset's class names.
            samplers (Sequence[tuple]): ``(index, EdgeSampler)`` of the
                data preprocessor's batch augments.

        Returns:
            Prior | None: the deployment prior where the match changed it
            (for the detector's buffer), else ``None``.

        Raises:
            ValueError: a named prior's class names are not ``classes``.
        """
        if self.matched:
            self._check_own_order(classes)
            return None
        try:
            value = self._in_order(classes)
        except ValueError as exc:
            raise ValueError(
                f'the class names of {self.value.name} (model.prior) do not '
                f"match the dataset's classes: {exc}") from None
        reordered = []
        for i, sampler in samplers:
            try:
                reordered.append((sampler, sampler.prior_in_order(classes)))
            except ValueError as exc:
                raise ValueError(
                    f'model.data_preprocessor.batch_augments[{i}]: {exc}'
                ) from exc
        if value is not None:
            self.set(value)
        self.pending, self.matched = False, True
        self.checkpoint_unsupported = False
        for sampler, matrix in reordered:
            if matrix is not None:
                sampler.dataset_prior = matrix
                sampler.prior_classes = list(classes)
            sampler.set_classes(classes)  # in order now: marks it checked
        return value

    def _in_order(self, classes: Sequence[str]) -> Optional[Prior]:
        """The deployment prior in the order of ``classes`` where that
        changes it: a pending named prior reordered by name, an unnamed
        one of the same K named, a checkpoint's prior with the configured
        prior's support; ``None`` where nothing changes."""
        value = self.value
        # an unnamed prior takes the classes' names where they fit it (not
        # placeholder names of another count)
        if self.pending or (value.classes is None
                            and len(classes) == value.num_classes):
            value = value.reorder(classes)
        if self.checkpoint_unsupported:
            value = self._with_configured_support(value, classes)
        return None if value is self.value else value

    def own_order(self, what: str = 'model.prior') -> None:
        """Take a pending prior in its file's order as the model's (a model
        trained without dataset classes): warn once, as mmdet's
        ``init_detector`` does for a model without classes."""
        if self.matched or not self.pending:
            return
        self.own_classes = self.value.classes
        if not self.warned_order:
            warnings.warn(
                f'{self.value.name} ({what}) names its classes, but no '
                'dataset classes reached the model: reading it in its own '
                "class order (set the model's dataset_meta, or train with "
                'PriorClassesHook, to match it by name)')
            self.warned_order = True
        self.pending, self.matched = False, True

    def _check_own_order(self, classes: Sequence[str]) -> None:
        """After a prior was read in its own order (:meth:`own_order`), the
        dataset's classes must be that order: other names, or the same in
        another order, mean the model trained on a misread prior.

        Raises:
            ValueError: naming the prior and the first class that differs.
        """
        own = self.own_classes
        if own is None or len(classes) != len(own):
            return
        try:
            Prior(np.eye(len(own)), own).reorder(classes)
        except ValueError as exc:
            raise ValueError(
                f'the class names of {self.value.name} (model.prior, read '
                f"in its own order) do not match the dataset's classes: "
                f'{exc}') from None
        order = class_order(own, classes)
        if (order != np.arange(len(own))).any():
            first = classes[int(np.argmax(order != np.arange(len(own))))]
            raise ValueError(
                f'{self.value.name} (model.prior) was read in its own class '
                f"order, which the dataset's classes do not keep (its "
                f'{first!r} stands elsewhere): the model trained on a '
                'misread prior; match the classes before training')

    # ------------------------------------------------------------------
    # checkpoints
    def from_checkpoint(self,
                        value: Tensor,
                        saved: List[Optional[Tensor]],
                        classes: Optional[Sequence[str]],
                        where: str,
                        name: Optional[str] = None) -> None:
        """Take a checkpoint's prior (in the model's class order) and the
        support it saved.

        Args:
            value (Tensor): the checkpoint's ``prior``.
            saved (list[Tensor | None]): its ``prior_support`` and
                ``prior_marginals`` (``None`` where not saved).
            classes (Sequence[str], optional): the model's classes, when
                known.
            where (str): how errors name the checkpoint's prior.
            name (str, optional): the name the prior keeps once valid
                (default ``where``), which later messages give.

        Raises:
            InvalidCheckpointPriorError: an invalid matrix or support, or
                one of the two support keys without the other.
        """
        present = [n for n, t in zip(SUPPORT_KEYS, saved) if t is not None]
        if len(present) == 1:
            missing = [n for n in SUPPORT_KEYS if n not in present][0]
            raise InvalidCheckpointPriorError(
                f'{where}: it saves {present[0]} without {missing} (a '
                'support needs both)')
        try:
            prior = Prior(
                value,
                support=saved[0],
                marginals=saved[1],
                num_classes=self.value.num_classes,
                name=where)
        except ValueError as exc:
            raise InvalidCheckpointPriorError(str(exc)) from None
        if name is not None:
            prior = prior.renamed(name)
        self.value, self.pending = prior, False
        if present:
            self.checkpoint_unsupported = False
            return
        if classes is not None and len(classes) == prior.num_classes:
            prior = prior.reorder(classes)
        self.value = self._with_configured_support(prior, classes)
        # without the classes, the configured support waits for them
        self.checkpoint_unsupported = classes is None and \
            self.configured.has_support

    def _with_configured_support(self, prior: Prior,
                                 classes: Optional[Sequence[str]]) -> Prior:
        """A checkpoint's prior without a saved support: the configured
        prior's where the matrices agree in the model's order (known, or
        the configured prior unnamed), else none."""
        configured = self.configured
        if not configured.has_support:
            return prior
        if configured.classes is not None:
            if classes is None:
                return prior  # decided once the classes are known
            try:
                configured = configured.reorder(classes)
            except ValueError:
                return prior
        if np.allclose(configured.matrix, prior.matrix, rtol=0,
                       atol=SAME_MATRIX_ATOL):
            return prior.with_support(*configured.support_pair())
        return prior


def save_prior_support(module, state_dict: dict, prefix: str,
                       local_metadata) -> None:
    """A CaliDet detector's state-dict hook: the deployment prior's support
    beside ``prior`` where the CaliFormer reads one (a checkpoint keeps
    what E was measured on)."""
    for name, value in zip(SUPPORT_KEYS, module.deployment_support()):
        if value is not None:
            state_dict[prefix + name] = value.detach().clone()


def load_checkpoint_prior(module, state_dict: dict, prefix: str,
                          *args) -> None:
    """A CaliDet detector's load pre-hook: a checkpoint's ``prior`` and the
    support saved beside it are validated like a prior file
    (:meth:`PriorState.from_checkpoint`), for every way of loading
    (mmengine's ``load_checkpoint``, the runner, ``load_state_dict``); a
    prior of another shape is left to the size-mismatch checks
    (:func:`~mmcalidet.utils.checkpoint_compat.check_checkpoint`).

    Raises:
        InvalidCheckpointPriorError: naming the key and the problem.
    """
    from ...priors import model_classes
    key = prefix + 'prior'
    value = state_dict.get(key)
    saved = [state_dict.pop(prefix + n, None) for n in SUPPORT_KEYS]
    if value is None or \
            tuple(getattr(value, 'shape', ())) != tuple(module.prior.shape):
        return
    state = module.prior_state
    state.from_checkpoint(
        value,
        saved,
        None if state.pending else model_classes(module),
        f'checkpoint has an invalid prior ({key!r} of '
        f'{type(module).__name__})',
        name=f'the checkpoint\'s prior ({key!r} of {type(module).__name__})')
    module._cali_cache = None
