# Copyright (c) mmcalidet contributors. All rights reserved.
"""The support of a prior (experimental, a relation-reading candidate): how
many images each class column of E was measured on (n), and each class's
share of them (p).

An image's prior E_x has n = 1 for every column and p = its label vector.
"""
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor


def check_support(values: Optional[Tensor], num: int, num_classes: int,
                  name: str, like: Tensor) -> Optional[Tensor]:
    """Validate a support-like tensor and broadcast it to (B, K).

    Args:
        values (Tensor, optional): (K,) or (B, K); ``None`` passes.
        num (int): B, the number of priors.
        num_classes (int): K.
        name (str): the argument's name, for errors.
        like (Tensor): gives the dtype and device.

    Returns:
        Tensor | None: (B, K).

    Raises:
        ValueError: wrong shape, non-finite or negative entries.
    """
    if values is None:
        return None
    values = torch.as_tensor(values).to(dtype=like.dtype, device=like.device)
    if values.dim() == 1:
        values = values.unsqueeze(0).expand(num, -1)
    if values.dim() != 2 or values.shape != (num, num_classes):
        raise ValueError(f'{name} must have shape (K,) or (B, K) with '
                         f'B={num}, K={num_classes}, got '
                         f'{tuple(values.shape)}')
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f'{name} must be finite (found NaN or inf)')
    if bool((values < 0).any()):
        raise ValueError(f'{name} must be >= 0, got a negative entry')
    return values


def support_features(support: Tensor,
                     marginals: Optional[Tensor] = None) -> Tensor:
    """Per-class support features ``[log(1 + n), p]``.

    Args:
        support (Tensor): (B, K) images per column, n.
        marginals (Tensor, optional): (B, K) class shares p; ``None``: 0.

    Returns:
        Tensor: (B, K, 2).
    """
    share = torch.zeros_like(support) if marginals is None else marginals
    return torch.stack([torch.log1p(support), share], dim=-1)


def shrunk_lift(priors: Tensor, support: Tensor, marginals: Tensor,
                shrink: float) -> Tensor:
    """The shrunk lift ``L[i, j] = log((P(i|j) + a) / (P(i) + a))``.

    0 in a column j measured on no image of class j (``n_j * p_j == 0``,
    e.g. an absent class's flat column) and on the diagonal. On one image's
    prior E_x (n = 1, p = its labels) every present column equals p, so
    L is exactly 0.

    Args:
        priors (Tensor): (B, K, K), ``E[i, j] = P(i | j)``.
        support (Tensor): (B, K) n.
        marginals (Tensor): (B, K) p = P(i).
        shrink (float): a > 0.

    Returns:
        Tensor: (B, K, K).
    """
    lift = torch.log((priors + shrink) / (marginals.unsqueeze(-1) + shrink))
    observed = (support * marginals) > 0
    # a float eye: ONNX Runtime has no boolean EyeLike
    off_diagonal = torch.eye(
        priors.shape[-1], dtype=priors.dtype, device=priors.device) == 0
    keep = observed.unsqueeze(-2) & off_diagonal
    return torch.where(keep, lift, torch.zeros_like(lift))


def label_support(label_lists: Sequence,
                  num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    """The support of a prior measured on a set of images: n = the number
    of images for every column, p = each class's share of the images.

    Args:
        label_lists (Sequence[array-like]): class indices per image.
        num_classes (int): K.

    Returns:
        tuple[np.ndarray, np.ndarray]: (K,) n and (K,) p (zeros when there
        are no images).
    """
    counts = np.zeros(num_classes)
    for labels in label_lists:
        counts[np.unique(np.asarray(labels, dtype=np.int64))] += 1
    num = len(label_lists)
    return np.full(num_classes, float(num)), counts / max(num, 1)
