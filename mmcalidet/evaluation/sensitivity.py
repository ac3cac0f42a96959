# Copyright (c) mmcalidet contributors. All rights reserved.
"""How much, and in which direction, a trained CaliDet head's calibration
vectors V' follow the injected prior -- without running the detector.

For each prior E, the change of class k's logit on a unit feature along
its own weight direction is ``rho * (V'_k(E) - V'_k(E0)) . W_k / |W_k|``.
A head that uses E as the paper intends raises the logits of the classes
that E_x marks present, and less so (or lowers them) under flip(E_x); a head
whose V' hardly changes with E (``relative_change`` near 0) ignores it.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..models.head_kinds import kind_of_head
from ..priors import flat_prior, flip_prior, sample_prior


@torch.no_grad()
def prior_sensitivity(head,
                      label_lists: Sequence[Sequence[int]],
                      train_prior: Optional[np.ndarray] = None) -> List[Dict]:
    """Sensitivity of V' to E_x, flip(E_x) and E_t.

    Args:
        head: a calibrated head (``get_cali_vectors``, ``rho``); W is its
            head kind's :meth:`~mmcalidet.models.head_kinds.HeadKind.
            class_weight`: a DETR's last decoder layer's classifier (not
            the encoder's proposal classifier that two-stage heads
            append), a dense head's first level's, a box head's.
        label_lists (Sequence[Sequence[int]]): the classes of each image
            whose E_x (and flip) is probed; images without a class are
            skipped.
        train_prior (np.ndarray, optional): E_t, probed when given.

    Returns:
        list[dict]: per prior kind (``E_x``, ``flip_E_x``, ``E_t``):
        ``prior``, ``num_priors``, ``relative_change`` (mean |V'_k(E) -
        V'_k(E0)| over mean |V'_k(E0)|; NaN where V'(E0) = 0),
        ``present_shift`` and
        ``absent_shift`` (mean logit change along W_k of the classes the
        image has / has not; for E_t every class counts as present).
    """
    kind = kind_of_head(head)
    if kind is None:
        raise TypeError(f'{type(head).__name__} is not a calibrated head '
                        '(it declares no head_kind)')
    weight = kind.class_weight(head)
    num_classes = weight.shape[0]
    unit = weight / weight.norm(dim=1, keepdim=True).clamp_min(1e-12)
    rho = float(head.rho)

    def vectors(priors: np.ndarray) -> torch.Tensor:
        return head.get_cali_vectors(
            torch.as_tensor(priors, dtype=weight.dtype, device=weight.device))

    v0 = vectors(flat_prior(num_classes))
    # V'(E0) = 0 (e.g. zero_init_output before training): no scale
    base = v0.norm(dim=-1).mean()
    base = float(base) if float(base) > 0 else float('nan')
    labels = [
        np.unique(np.asarray(lab, dtype=np.int64)) for lab in label_lists
    ]
    labels = [lab for lab in labels if len(lab)]
    kinds = {}
    if labels:
        e_x = np.stack([sample_prior(num_classes, lab) for lab in labels])
        kinds['E_x'] = (e_x, labels)
        kinds['flip_E_x'] = (np.stack([flip_prior(p) for p in e_x]), labels)
    if train_prior is not None:
        kinds['E_t'] = (np.asarray(train_prior)[None],
                        [np.arange(num_classes)])
    rows = []
    for kind, (priors, present) in kinds.items():
        delta = vectors(priors) - v0  # (B, K, d)
        shift = rho * (delta * unit).sum(-1)  # (B, K)
        mask = torch.zeros_like(shift, dtype=torch.bool)
        for b, cls in enumerate(present):
            mask[b, torch.as_tensor(cls, device=mask.device)] = True
        rows.append(
            dict(
                prior=kind,
                num_priors=len(priors),
                relative_change=float(delta.norm(dim=-1).mean()) / base,
                present_shift=float(shift[mask].mean()),
                absent_shift=float(shift[~mask].mean()) if
                (~mask).any() else float('nan')))
    return rows
