# Copyright (c) mmcalidet contributors. All rights reserved.
"""Stop training with one clear error when numbers become NaN or inf.

Without it, NaN logits reach mmdet's Hungarian matcher and the run dies in
scipy (``ValueError: matrix contains invalid numeric entries``), and a NaN
loss is logged as ``nan`` until the weights are all NaN. The CaliDet heads
check what the matcher sees (:meth:`CalibratedClsMixin.check_finite_outputs
<mmcalidet.models.dense_heads.calibrated_cls.CalibratedClsMixin>`), the
CaliDet detectors every loss term (``parse_losses``); both raise
:class:`NonFiniteError` naming the iteration and what is not finite.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
from mmengine.logging import MessageHub
from torch import Tensor


class NonFiniteError(FloatingPointError):
    """Training met NaN or inf values (loss terms or head outputs)."""


def current_iteration() -> Optional[int]:
    """The training iteration, counted from 1 as mmengine logs it
    (``Iter(train) [12/400]``); ``None`` outside a runner's training loop.

    Returns:
        int | None: the iteration.
    """
    info = MessageHub.get_current_instance().get_info('iter')
    return None if info is None else int(info) + 1


def _at_iteration() -> str:
    iteration = current_iteration()
    return '' if iteration is None else f' at iteration {iteration}'


def _all_finite(tensors: Sequence[Tensor]) -> Tensor:
    """One boolean per tensor (computed on the tensors' device, read with
    a single synchronisation by the caller)."""
    return torch.stack([torch.isfinite(t.detach()).all() for t in tensors])


def check_finite_losses(loss: Tensor, log_vars: Dict[str, Tensor]) -> None:
    """Raise if the total loss is not finite, naming the terms that are not.

    Args:
        loss (Tensor): the total loss (``parse_losses``).
        log_vars (dict[str, Tensor]): the terms (``parse_losses``; the
            total, ``'loss'``, is left out of the message).

    Raises:
        NonFiniteError: e.g. ``non-finite loss at iteration 12:
        loss_cls=nan, d0.loss_cls=nan (the others are finite)``.
    """
    if bool(torch.isfinite(loss.detach()).all()):
        return
    terms = [(k, v) for k, v in log_vars.items() if k != 'loss']
    finite = _all_finite([v for _, v in terms]).tolist() if terms else []
    bad = [(k, v) for (k, v), ok in zip(terms, finite) if not ok]
    if bad:
        listed = ', '.join(f'{k}={float(v.detach().float().mean()):g}'
                           for k, v in bad)
        others = ' (the others are finite)' if len(bad) < len(terms) else ''
        detail = f'{listed}{others}'
    else:
        detail = (f'loss={float(loss.detach()):g}, every term is finite '
                  '(their sum overflows)')
    raise NonFiniteError(f'non-finite loss{_at_iteration()}: {detail}')


def check_finite_tensors(what: str,
                         named: Sequence[Tuple[str, Optional[Tensor]]],
                         inputs: Sequence[Tuple[str, Optional[Tensor]]] = (),
                         when: str = '') -> None:
    """Raise if any of ``named`` holds NaN or inf, naming which (and which
    of ``inputs``, the tensors they were computed from, are not finite).

    Args:
        what (str): what the tensors are, for the message.
        named (Sequence[tuple[str, Tensor | None]]): the tensors checked
            (``None`` entries are skipped).
        inputs (Sequence[tuple[str, Tensor | None]]): their inputs, only
            inspected when a checked tensor is not finite.
        when (str): the step, for the message (e.g. ``'before the
            Hungarian matching'``).

    Raises:
        NonFiniteError: e.g. ``non-finite head outputs at iteration 12
        (before the Hungarian matching): decoder layer 1 logits (4800 of
        4800 values); inputs: decoder hidden states finite, V' (CaliFormer
        output) not finite``.
    """
    named = [(k, v) for k, v in named if v is not None]
    finite = _all_finite([v for _, v in named])
    if bool(finite.all()):
        return
    parts = []
    for (name, value), ok in zip(named, finite.tolist()):
        if not ok:
            count = int((~torch.isfinite(value.detach())).sum())
            parts.append(f'{name} ({count} of {value.numel()} values)')
    when = f' ({when})' if when else ''
    message = f'non-finite {what}{_at_iteration()}{when}: ' + ', '.join(parts)
    inputs = [(k, v) for k, v in inputs if v is not None]
    if inputs:
        states = _all_finite([v for _, v in inputs]).tolist()
        message += '; inputs: ' + ', '.join(
            f'{k} {"finite" if ok else "not finite"}'
            for (k, _), ok in zip(inputs, states))
    raise NonFiniteError(message)


def non_finite_sources(model: torch.nn.Module,
                       batch_inputs: Optional[Tensor] = None,
                       listed: int = 3) -> str:
    """Where a non-finite forward may come from: the model's parameters
    and buffers that are not finite, and whether the batch is.

    Args:
        model (nn.Module): the detector.
        batch_inputs (Tensor, optional): the images it was given.
        listed (int): at most this many tensors are named.

    Returns:
        str: e.g. ``'weights: all finite; images: not finite'`` or
        ``'weights: 2 of 310 tensors not finite (backbone.conv1.weight,
        neck.convs.0.conv.weight); images: finite'``.
    """
    named = list(model.named_parameters()) + list(model.named_buffers())
    named = [(k, v) for k, v in named if v.is_floating_point()]
    bad = [
        k for (k, _), ok in zip(named,
                                _all_finite([v for _, v in named]).tolist())
        if not ok
    ] if named else []
    if bad:
        more = ', ...' if len(bad) > listed else ''
        weights = (f'{len(bad)} of {len(named)} tensors not finite '
                   f'({", ".join(bad[:listed])}{more})')
    else:
        weights = 'all finite'
    text = f'weights: {weights}'
    if torch.is_tensor(batch_inputs):
        ok = bool(torch.isfinite(batch_inputs.detach()).all())
        text += f'; images: {"finite" if ok else "not finite"}'
    return text


class NonFiniteLossesMixin:
    """A detector whose training stops at a non-finite loss, naming the
    terms, and whose non-finite head outputs name what they were computed
    from; a base of
    :class:`~mmcalidet.models.detectors.CalibratableDetectorMixin`."""

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

    def loss(self, batch_inputs, batch_data_samples) -> dict:
        """The detector's losses; a :class:`NonFiniteError` of the head
        also names what the forward was computed from: the weights (a
        diverged run) or the images (a bad input)."""
        try:
            return super().loss(batch_inputs, batch_data_samples)
        except NonFiniteError as error:
            raise NonFiniteError(
                f'{error}; {non_finite_sources(self, batch_inputs)}'
            ) from None
