# Copyright (c) mmcalidet contributors. All rights reserved.
"""Tensor helpers for relation matrices E (E[i, j] = P(i | j))."""
import torch
from torch import Tensor


def flat_prior_like(prior: Tensor) -> Tensor:
    """The flat prior E0 (0.5 off the diagonal, 1 on it) as a K x K tensor
    with the dtype and device of ``prior``.

    Args:
        prior (Tensor): any tensor whose last two dims are K x K.

    Returns:
        Tensor: K x K.
    """
    num_classes = prior.shape[-1]
    eye = torch.eye(num_classes, dtype=prior.dtype, device=prior.device)
    # 0.5 + 0.5 * I: exact in floating point, and an ONNX-exportable op
    # (fill_diagonal_ is not)
    return 0.5 + 0.5 * eye


def prior_delta(prior: Tensor) -> Tensor:
    """Delta E = E - E0, in [-0.5, 0.5] off the diagonal, 0 on it.

    Args:
        prior (Tensor): relation matrices of shape (..., K, K).

    Returns:
        Tensor: same shape as ``prior``.
    """
    if prior.dim() < 2 or prior.shape[-1] != prior.shape[-2]:
        raise ValueError('a prior must have shape (..., K, K), got '
                         f'{tuple(prior.shape)}')
    return prior - flat_prior_like(prior)
