# Copyright (c) mmcalidet contributors. All rights reserved.
"""A batch's per-sample priors and their support, from the data samples.

A data sample's ``prior`` (K x K) overrides the detector's deployment
prior for that image (oracle evaluation, multi-site batches, the
EdgeSampler's training priors, a call prior of ``inference_detector``);
its ``prior_support`` / ``prior_marginals`` (experimental) say what that
prior was measured on.
"""
from typing import Optional, Sequence, Tuple

import torch
from mmdet.structures import OptSampleList
from torch import Tensor

from .prior_state import SUPPORT_KEYS


def sample_priors(samples: OptSampleList, deployment: Tensor,
                  num_classes: int) -> Optional[Tensor]:
    """The (B, K, K) per-sample priors of a batch (a sample without a
    ``prior`` gets the deployment prior), or ``None`` when no sample has
    one (the deployment prior then applies to all).

    Args:
        samples (list[DetDataSample], optional): the batch's data samples.
        deployment (Tensor): the deployment prior (K, K); gives the dtype
            and device.
        num_classes (int): K.

    Returns:
        Tensor | None: (B, K, K).

    Raises:
        ValueError: a sample prior that is not K x K.
    """
    if not samples:
        return None
    found = [ds.get('prior', None) for ds in samples]
    if all(p is None for p in found):
        return None
    k = num_classes
    priors = []
    for p in found:
        p = deployment if p is None else torch.as_tensor(
            p, dtype=deployment.dtype, device=deployment.device)
        if p.shape != (k, k):
            raise ValueError(f'a data sample prior must be {k} x {k}, got '
                             f'{tuple(p.shape)}')
        priors.append(p)
    return torch.stack(priors)


def sample_supports(
    samples: OptSampleList, deployment: Sequence[Optional[Tensor]],
    like: Tensor
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The per-sample (support, marginals), each (B, K), from the data
    samples' ``prior_support`` / ``prior_marginals``, or ``None`` where no
    sample's prior has one. A sample without its own ``prior`` gets the
    deployment prior's.

    Args:
        samples (list[DetDataSample], optional): the batch's data samples.
        deployment (Sequence[Tensor | None]): the deployment prior's
            (support, marginals).
        like (Tensor): gives the dtype and device.

    Returns:
        tuple[Tensor | None, Tensor | None]: (B, K) each.

    Raises:
        ValueError: a batch where some priors have a support and others
            none (each row of V' is computed one way).
    """
    samples = samples or []
    own_prior = [ds.get('prior', None) is not None for ds in samples]
    out = []
    for field, default in zip(SUPPORT_KEYS, deployment):
        rows = []
        for ds, own in zip(samples, own_prior):
            v = ds.get(field, None)
            if v is None and not own:
                v = default
            rows.append(None if v is None else torch.as_tensor(
                v, dtype=like.dtype, device=like.device))
        if all(v is None for v in rows):
            out.append(None)
            continue
        if any(v is None for v in rows):
            raise ValueError(f'a batch mixes priors with a {field} and '
                             'priors without one: run them in separate '
                             'batches')
        out.append(torch.stack(rows))
    return out[0], out[1]
