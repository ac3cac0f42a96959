# Copyright (c) mmcalidet contributors. All rights reserved.
"""What the evaluation's priors were measured on (experimental): for a
CaliFormer that reads a prior's support (``support_features`` /
``lift_bias``), each prior built from labels is registered with its support
n and class shares p, as the edge sampler gives them in training: an
image's E_x (n = 1, p = its label vector), E_b of a group and E_v (n = the
group's images), E_t (the training set's images and class frequencies) and
a site's own statistics E_site (the site's images).

A prior not registered here (E0, flip(E_x), a fitted site prior) has no
support, as in training for E0.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..models.layers.support_ops import label_support
from ..priors import batch_prior, sample_prior
from ..priors.prior import Prior
from ..priors.shrinkage import shrink
from .scoring import Rescorer


def register_label_supports(
        rescorer: Rescorer,
        label_lists: Sequence[np.ndarray],
        train: Optional[Prior] = None,
        batch_ids: Optional[Sequence[int]] = None,
        sites: Optional[Dict[str, Tuple[np.ndarray, Sequence[int]]]] = None,
        sweep_alphas: Sequence[float] = ()) -> int:
    """Register the support of the priors the evaluation builds from
    labels (see :meth:`Rescorer.register_support`).

    Args:
        rescorer (Rescorer): the CaliDet model's scorer (nothing happens
            when its CaliFormer reads no support).
        label_lists (Sequence[np.ndarray]): class indices per cached image.
        train (Prior, optional): E_t in the evaluation's class order,
            registered with the support it records (if any).
        batch_ids (Sequence[int], optional): evaluation batch per image
            (E_b's groups).
        sites (dict, optional): site -> (E_site, its image indices).
        sweep_alphas (Sequence[float]): also register each site's sweep
            priors ``shrink(E_t, E_site, alpha)`` (alpha != 0: alpha 0 is
            E_t) with the site's n and the shares moved as the prior,
            ``p_t + alpha (p_site - p_t)`` clipped to [0, 1] (needs E_t's
            support).

    Returns:
        int: the priors registered (0 for a model that reads no support).
    """
    if not rescorer.reads_support:
        return 0
    k = rescorer.num_classes
    count = 0

    def add(prior, lists):
        nonlocal count
        rescorer.register_support(prior, *label_support(lists, k))
        count += 1

    if train is not None and train.has_support:
        train_prior = np.array(train.matrix)
        rescorer.register_support(train_prior, *train.support_pair())
        count += 1
        for prior, idx in (sites or {}).values():
            n, share = label_support([label_lists[i] for i in idx], k)
            for alpha in (a for a in sweep_alphas if a != 0):
                rescorer.register_support(
                    shrink(train_prior, prior, alpha), n,
                    np.clip(train.marginals + alpha *
                            (share - train.marginals), 0, 1))
                count += 1
    add(batch_prior(k, label_lists), label_lists)
    if batch_ids is not None:
        ids = np.asarray(batch_ids)
        for g in np.unique(ids):
            group = [label_lists[i] for i in np.flatnonzero(ids == g)]
            add(batch_prior(k, group), group)
    for prior, idx in (sites or {}).values():
        add(prior, [label_lists[i] for i in idx])
    # last: an image's E_x keeps n = 1 where a group of images with the
    # same classes gives the same matrix
    for labels in label_lists:
        add(sample_prior(k, labels), [labels])
    return count
