# Copyright (c) mmcalidet contributors. All rights reserved.
"""The V' term of a calibrated classifier on cached features."""
import torch
from torch import Tensor


def add_calibration(logits: Tensor, hidden: Tensor, deltas: Tensor,
                    rho: float) -> Tensor:
    """``logits + rho * V'^T h``: the plain logits of cached features
    calibrated, as ``(W + rho V')^T h + b`` gives them.

    Args:
        logits (Tensor): (B, Q, C) plain logits ``W^T h + b``.
        hidden (Tensor): (B, Q, d) the cached features h.
        deltas (Tensor): V' laid out like the C outputs (zero rows where
            an output is not calibrated), (C, d) shared or (B, C, d) per
            image.
        rho (float): the scale of V'.

    Returns:
        Tensor: (B, Q, C) calibrated logits.
    """
    if deltas.dim() == 2:
        return logits + rho * hidden @ deltas.t()
    return logits + rho * torch.einsum('bqd,bcd->bqc', hidden, deltas)
