# Copyright (c) mmcalidet contributors. All rights reserved.
"""Per-site evaluation: each deployment site (a named group of evaluation
images, e.g. the ``site`` key of the context-shift benchmark's
``instances_val.json``) under E_t and under its own statistics E_site.

A calibratable detector should gain from E_site where the site's relations
differ from training (large epsilon = MAE(E_site, E_t)) and lose nothing
where they do not.
"""
import json
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..priors import batch_prior, prior_mae
from ..utils.file_io import check_readable_file
from .coco import METRICS
from .sweep import Method


def read_image_groups(ann_file: str,
                      img_ids: Sequence,
                      key: str = 'site') -> List[str]:
    """The group (site) of each evaluated image, from a COCO JSON whose
    ``images`` entries carry ``key``.

    Args:
        ann_file (str): COCO annotation file.
        img_ids (Sequence): ids of the evaluated images, in cache order.
        key (str): the image field naming the group. Defaults to ``site``.

    Returns:
        list[str]: the group of each image of ``img_ids``.
    """
    check_readable_file(ann_file, what='annotation file')
    with open(ann_file) as f:
        data = json.load(f)
    images = data.get('images') if isinstance(data, dict) else None
    if not images:
        raise ValueError(f'{ann_file}: no images')
    by_id = {}
    for img in images:
        if key not in img:
            raise ValueError(f'{ann_file}: image {img.get("id")} has no '
                             f'{key!r} field')
        by_id[img['id']] = str(img[key])
    missing = [i for i in img_ids if i not in by_id]
    if missing:
        raise ValueError(f'{ann_file} has no image with id {missing[0]!r} '
                         '(is it the evaluated annotation file?)')
    return [by_id[i] for i in img_ids]


def evaluate_groups(methods: Sequence[Method],
                    evaluate: Callable,
                    train_prior: np.ndarray,
                    groups: Sequence[str],
                    order: Optional[Sequence[str]] = None) -> List[Dict]:
    """Evaluate every method on every group under E_t and under the group's
    own statistics E_site (methods without a prior: one row).

    Args:
        methods (Sequence[Method]): the detectors (caches of the same images
            in the same order).
        evaluate (callable): ``evaluate(cache, predictions, indices) ->
            metrics`` on the images ``indices`` of the cache.
        train_prior (np.ndarray): E_t.
        groups (Sequence[str]): the group of each cached image.
        order (Sequence[str], optional): groups in table order (default:
            first appearance).

    Returns:
        list[dict]: per (group, method, prior): ``site``, ``num_images``,
        ``method``, ``prior`` (``E_t``, ``E_site`` or ``-``), ``epsilon``
        (MAE(E_site, E_t), the same on every row of a site), the metrics
        and, for E_site, ``gain_<metric>`` over E_t.
    """
    if not methods:
        return []
    cache = methods[0].cache
    if len(groups) != len(cache):
        raise ValueError(f'{len(groups)} group labels for {len(cache)} '
                         'cached images')
    labels = cache.gt_label_lists()
    k = train_prior.shape[0]
    names = list(order) if order is not None else list(dict.fromkeys(groups))
    unknown = set(groups) - set(names)
    if unknown:
        raise ValueError(f'groups {sorted(unknown)} missing from order')
    groups = np.asarray(groups)
    rows = []
    for site in names:
        idx = np.flatnonzero(groups == site)
        if not len(idx):
            raise ValueError(f'no image of site {site!r}')
        site_prior = batch_prior(k, [labels[i] for i in idx])
        eps = prior_mae(site_prior, train_prior)
        for method in methods:
            start = time.perf_counter()
            common = dict(
                site=site, num_images=len(idx), method=method.name,
                epsilon=eps)
            if not method.takes_prior:
                preds = method.rescorer.predict(None, idx)
                rows.append(
                    dict(common, prior='-', **evaluate(cache, preds, idx)))
                continue
            base = evaluate(method.cache,
                            method.rescorer.predict(train_prior, idx), idx)
            own = evaluate(method.cache,
                           method.rescorer.predict(site_prior, idx), idx)
            rows.append(dict(common, prior='E_t', **base))
            rows.append(
                dict(
                    common,
                    prior='E_site',
                    **own,
                    **{f'gain_{m}': own[m] - base[m]
                       for m in METRICS},
                    seconds=time.perf_counter() - start))
    return rows
