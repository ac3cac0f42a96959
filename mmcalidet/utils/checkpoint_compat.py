# Copyright (c) mmcalidet contributors. All rights reserved.
"""Compare a checkpoint with the model it is about to be loaded into.

mmengine loads non-strictly by default and only logs the keys that do not
fit, so a checkpoint of another class count (its classification layers,
the CaliFormer's class nodes and the prior do not fit) or a plain
detector's checkpoint evaluated with a CaliDet config (a random
CaliFormer) runs without an error. :func:`check_checkpoint` says what does
not fit, in the terms of CaliDet, and raises where going on would be
wrong.
"""
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .model_heads import classifying_head

#: state-dict keys a checkpoint may save or not: the deployment prior's
#: support (a support-aware CaliFormer's prior that has one)
OPTIONAL_KEYS = ('prior_support', 'prior_marginals')

#: the keys mmengine strips before loading (its default ``revise_keys``)
_REVISE_KEYS = ((r'^module\.', ''), )


class CheckpointError(ValueError):
    """A checkpoint cannot be used: the base of the errors below, which the
    tools report in one line."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint does not fit the model it is loaded into."""


class InvalidCheckpointPriorError(CheckpointError):
    """A checkpoint's stored ``prior`` is not a valid prior (NaN, values
    outside [0, 1], a diagonal that is not 1)."""


def is_calibration_key(key: str) -> bool:
    """Whether a state-dict key belongs to CaliDet's calibration: the
    detector's deployment ``prior`` or the head's CaliFormer."""
    return key == 'prior' or key.startswith('califormer.') or \
        '.califormer.' in key


def _shape(value) -> Optional[Tuple[int, ...]]:
    shape = getattr(value, 'shape', None)
    return tuple(shape) if shape is not None else None


def _short(keys: Sequence[str], limit: int = 4) -> str:
    more = f', ... ({len(keys)} in all)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def _class_counts(model, mismatched: Dict[str, tuple]) -> Optional[tuple]:
    """(checkpoint K, model K) if the prior or a classifier of the
    classifying head is among the mismatched tensors: a weight of that
    head whose first dimension is K plus a constant (K outputs of a
    sigmoid head, K + 1 of a softmax one) and whose other dimensions
    match, the first in the model's order."""
    head = classifying_head(model)
    model_k = getattr(head, 'num_classes', None)
    if model_k is None:
        return None
    if 'prior' in mismatched:
        return mismatched['prior'][0][0], model_k
    prefix = next(
        (name + '.'
         for name, module in model.named_modules() if module is head), None)
    for key, (ckpt, own) in mismatched.items():
        if prefix is None or not key.startswith(prefix) or \
                not key.endswith('.weight') or len(ckpt) != len(own) or \
                tuple(ckpt[1:]) != tuple(own[1:]) or \
                own[0] not in (model_k, model_k + 1):
            continue
        return ckpt[0] - (own[0] - model_k), model_k
    return None


def check_checkpoint(model,
                     state_dict: Mapping,
                     allow_shape_mismatch: bool = False,
                     allow_uncalibrated: bool = True,
                     allow_missing: bool = True) -> List[str]:
    """Compare a checkpoint's state dict with ``model`` before loading.

    Args:
        model (nn.Module): the (unwrapped) model.
        state_dict (Mapping): the checkpoint's ``state_dict``.
        allow_shape_mismatch (bool): only report (not raise) tensors whose
            shapes differ, e.g. to fine-tune a checkpoint on another class
            set (they keep their initialisation). Defaults to False.
        allow_uncalibrated (bool): only report (not raise) a checkpoint
            without CaliDet calibration loaded into a CaliDet model, e.g. a
            plain DINO checkpoint to fine-tune. Defaults to True.
        allow_missing (bool): only report (not raise) other model tensors
            the checkpoint lacks. Defaults to True.

    Returns:
        list[str]: messages to log (empty when everything fits).

    Raises:
        CheckpointMismatchError: naming what does not fit.
    """
    own = dict(model.state_dict())
    for key in OPTIONAL_KEYS:  # saved where the prior has a support
        own.pop(key, None)
    ckpt = {}
    for key, value in state_dict.items():
        for pattern, repl in _REVISE_KEYS:
            key = re.sub(pattern, repl, key)
        ckpt[key] = value
    model_name = type(model).__name__
    messages = []

    mismatched = {}
    for key, value in own.items():
        if key in ckpt:
            shape = _shape(ckpt[key])
            if shape is not None and shape != tuple(value.shape):
                mismatched[key] = (shape, tuple(value.shape))
    if mismatched:
        details = '; '.join(f'{k}: checkpoint {a}, model {b}'
                            for k, (a, b) in list(mismatched.items())[:4])
        if len(mismatched) > 4:
            details += f'; ... ({len(mismatched)} tensors in all)'
        counts = _class_counts(model, mismatched)
        why = (f'the checkpoint was trained for {counts[0]} classes, the '
               f'model has {counts[1]}. '
               if counts and counts[0] != counts[1] else '')
        message = (f'checkpoint does not fit {model_name}: {why}Tensors '
                   f'with other shapes: {details}.')
        if not allow_shape_mismatch:
            raise CheckpointMismatchError(
                message + ' To fine-tune on other classes anyway (these '
                'tensors keep their initialisation), set '
                'allow_shape_mismatch=True in the CheckpointCompatHook.')
        messages.append(message + ' They keep their initialisation.')

    calibrated_model = any(is_calibration_key(k) for k in own)
    calibrated_ckpt = any(is_calibration_key(k) for k in ckpt)
    missing_cali = [k for k in own if is_calibration_key(k) and k not in ckpt]
    if calibrated_model and not calibrated_ckpt:
        message = (
            f'checkpoint has no CaliDet calibration (a plain detector\'s): '
            f'{model_name}\'s CaliFormer and prior ({_short(missing_cali)}) '
            'are not in it and keep their initial values.')
        if not allow_uncalibrated:
            raise CheckpointMismatchError(
                message + ' Its classification would use an untrained '
                'CaliFormer: test a CaliDet checkpoint (fine-tune this one '
                'with a CaliDet config first), or use the baseline\'s config '
                'for this checkpoint.')
        messages.append(message + ' Fine-tune to train them (the paper\'s '
                        'recipe starts from a baseline checkpoint).')
    elif calibrated_ckpt and not calibrated_model:
        dropped = [k for k in ckpt if is_calibration_key(k)]
        messages.append(
            f'checkpoint is a CaliDet checkpoint loaded into a plain '
            f'{model_name}: its calibration ({_short(dropped)}) is dropped. '
            'The classification becomes W^T h + b, the CaliDet model without '
            'its rho * V\'^T h term (which is not the same as injecting the '
            'flat prior E0).')
    elif missing_cali:
        messages.append(f'checkpoint lacks part of the calibration: '
                        f'{_short(missing_cali)} keep their initial values.')

    missing = [k for k in own if k not in ckpt and not is_calibration_key(k)]
    if missing:
        message = (f'checkpoint lacks {len(missing)} of the '
                   f'{len(own)} tensors of {model_name} ({_short(missing)})')
        if not allow_missing:
            raise CheckpointMismatchError(
                message + ': is it a checkpoint of this config?')
        messages.append(message + '; they keep their initial values.')
    return messages
