# Copyright (c) mmcalidet contributors. All rights reserved.
"""Evaluation over partitions of the evaluation images, each under E_t and
under its own statistics: the paper's subsets (Sec. 4.3, Tab. 3), the
context-shift benchmark's deployment sites, and the subsets that
self-calibration runs on (Sec. 4.4) all use :func:`evaluate_partitions`.

Subsets: the evaluation set is split into equal, non-overlapping random
subsets: ``perm = numpy.random.default_rng(seed).permutation(N)``, subset
``k`` of size ``s`` is ``perm[k * s:(k + 1) * s]`` for ``k < N // s`` (the
remainder is left out). Per subset the model is evaluated under E_t and
under the subset's own statistics E_b; metrics are averaged over the
subsets of a size, and ``epsilon = mean over subsets of MAE(E_b, E_t)``.

With the images of COCO val2017 ordered as the image-level label files
list them (sorted by id) followed by the 48 images without labels, seed 0
and 80 classes this gives epsilon = .374 / .312 / .230 / .141 / .074 /
.043 for sizes 8 ... 256, the figures of ``../shared/paper/notes.md``
(the paper's .331 / .276 / ... come from DINO's 91 id slots). The labels
and sites are read from files by :mod:`.image_labels`.
"""
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..priors import batch_prior, prior_mae
from ..utils.progress import progress_bar
from .coco import METRICS
from .sweep import Method

#: the paper's subset sizes
SUBSET_SIZES = (8, 16, 32, 64, 128, 256)


def split_subsets(num_images: int,
                  size: int,
                  seed: int = 0) -> List[np.ndarray]:
    """Equal, non-overlapping, seeded random subsets of ``range(N)``.

    Args:
        num_images (int): N.
        size (int): images per subset.
        seed (int): seed of ``numpy.random.default_rng``.

    Returns:
        list[np.ndarray]: ``N // size`` index arrays (the remainder is left
        out).
    """
    if size < 1:
        raise ValueError(f'subset size must be >= 1, got {size}')
    perm = np.random.default_rng(seed).permutation(num_images)
    return [perm[k * size:(k + 1) * size] for k in range(num_images // size)]


def subset_epsilon(label_lists: Sequence[np.ndarray],
                   train_prior: np.ndarray,
                   sizes: Sequence[int] = SUBSET_SIZES,
                   seed: int = 0,
                   progress: bool = False) -> List[Dict]:
    """epsilon = mean over subsets of MAE(E_b, E_t), per subset size.

    Args:
        label_lists (Sequence[np.ndarray]): class indices per image (an
            empty array for an image without objects), in dataset order.
        train_prior (np.ndarray): E_t (K x K).
        sizes (Sequence[int]): subset sizes.
        seed (int): split seed.
        progress (bool): show a progress bar.

    Returns:
        list[dict]: per size ``size``, ``num_subsets``, ``epsilon`` (``nan``
        without a subset) and ``epsilon_std`` over subsets.
    """
    rows = []
    for size in progress_bar(sizes, desc='epsilon', enabled=progress):
        maes = [
            prior_mae(p, train_prior) for p in partition_priors(
                label_lists, split_subsets(len(label_lists), size, seed),
                train_prior.shape[0])
        ]
        rows.append(
            dict(
                size=int(size),
                num_subsets=len(maes),
                epsilon=float(np.mean(maes)) if maes else float('nan'),
                epsilon_std=float(np.std(maes)) if maes else float('nan')))
    return rows


def calibration_subsets(num_cached: int,
                        size: int,
                        num_images: Optional[int] = None,
                        seed: int = 0) -> List[np.ndarray]:
    """The subsets self-calibration runs on (the paper's Sec. 4.4: subsets
    of one size summing up to ``num_images``): the first
    ``num_images // size`` subsets of :func:`split_subsets`, or, for
    ``size == 0``, the first ``num_images`` images as one set."""
    total = num_cached if num_images is None else min(num_images, num_cached)
    check_subset_sizes([size], total)
    subsets = [np.arange(total)] if size == 0 else \
        split_subsets(num_cached, size, seed)[:total // size]
    if not subsets:
        raise ValueError(f'no subset of {size} images among {total}')
    return subsets


def check_subset_sizes(sizes: Sequence[int],
                       total: Optional[int],
                       what: str = '') -> None:
    """Refuse subset sizes no subset can have: above the ``total`` images
    there are (or, before a detector pass, at most will be: the smaller of
    ``--num-images`` and ``--max-images``). 0 is the whole set.

    Args:
        sizes (Sequence[int]): the sizes (>= 0).
        total (int, optional): the images there are, or at most will be
            (``None``: not known, nothing refused).
        what (str): where ``total`` comes from, for the message (e.g.
            ``' (--max-images 2)'``).

    Raises:
        ValueError: ``no subset of <size> images among <total>``.
    """
    for size in sizes:
        if size < 0:
            raise ValueError(f'subset size must be >= 0, got {size}')
        if total is not None and size > total:
            raise ValueError(f'no subset of {size} images among '
                             f'{total}{what}')


def partition_priors(label_lists: Sequence[np.ndarray],
                     partitions: Sequence[np.ndarray],
                     num_classes: int) -> List[np.ndarray]:
    """The statistics E_p of each partition's ground-truth labels."""
    return [
        batch_prior(num_classes, [label_lists[i] for i in idx])
        for idx in partitions
    ]


def evaluate_partitions(
        methods: Sequence[Method],
        evaluate: Callable,
        train_prior: np.ndarray,
        partitions: Sequence[np.ndarray],
        base: Optional[Dict[str, list]] = None,
        priors: Optional[Sequence[np.ndarray]] = None) -> List[Dict]:
    """Evaluate every method on every partition of the cached images under
    E_t and under the partition's own statistics E_p (a method without a
    prior: once, with no prior).

    Args:
        methods (Sequence[Method]): the detectors (caches of the same images
            in the same order).
        evaluate (callable): ``evaluate(cache, predictions, indices) ->
            metrics`` on the images ``indices`` of the cache.
        train_prior (np.ndarray): E_t.
        partitions (Sequence[np.ndarray]): the image indices of each
            partition.
        base (dict, optional): method name -> predictions of all cached
            images under E_t (or no prior), filled here when missing: E_t
            is then scored once for all partitions (and all calls sharing
            the dict) instead of once per partition.
        priors (Sequence[np.ndarray], optional): E_p of each partition when
            the caller has them (:func:`partition_priors` of the cached
            ground truth otherwise).

    Returns:
        list[dict]: per partition (outer) and method (inner): ``method``,
        ``index`` (of the partition), ``num_images``, ``epsilon``
        (MAE(E_p, E_t)), ``E_t`` (the metrics under E_t or no prior),
        ``own`` (under E_p; ``None`` without a prior) and ``seconds``.
    """
    if not methods:
        return []
    if priors is None:
        priors = partition_priors(methods[0].cache.gt_label_lists(),
                                  partitions, train_prior.shape[0])
    if len(priors) != len(partitions):
        raise ValueError(f'{len(priors)} priors for {len(partitions)} '
                         'partitions')
    out = []
    for n, (idx, own) in enumerate(zip(partitions, priors)):
        eps = prior_mae(own, train_prior)
        for method in methods:
            start = time.perf_counter()
            prior = train_prior if method.takes_prior else None
            if base is None:
                preds = method.rescorer.predict(prior, idx)
            else:
                if method.name not in base:
                    base[method.name] = method.rescorer.predict(prior)
                preds = [base[method.name][i] for i in idx]
            row = dict(
                method=method.name,
                index=n,
                num_images=len(idx),
                epsilon=eps,
                E_t=evaluate(method.cache, preds, idx),
                own=None)
            if method.takes_prior:
                row['own'] = evaluate(method.cache,
                                      method.rescorer.predict(own, idx), idx)
            out.append(dict(row, seconds=time.perf_counter() - start))
    return out


def _gains(own: Dict, base: Dict) -> Dict[str, float]:
    return {f'gain_{m}': own[m] - base[m] for m in METRICS}


def _mean_metrics(per_subset: Sequence[Dict]) -> Dict[str, float]:
    out = {}
    for m in METRICS:
        vals = np.array([r[m] for r in per_subset], dtype=np.float64)
        out[m] = float(np.nanmean(vals)) if np.isfinite(vals).any() \
            else float('nan')
    return out


def evaluate_subsets(methods: Sequence[Method],
                     evaluate: Callable,
                     train_prior: np.ndarray,
                     sizes: Sequence[int] = SUBSET_SIZES,
                     seed: int = 0,
                     progress: bool = True) -> List[Dict]:
    """Subset evaluation of cached detectors (:func:`evaluate_partitions`
    on the subsets of each size, averaged over subsets).

    Args:
        methods (Sequence[Method]): the detectors (all caches hold the same
            images in the same order).
        evaluate (callable): see :func:`evaluate_partitions`.
        train_prior (np.ndarray): E_t.
        sizes (Sequence[int]): subset sizes.
        seed (int): split seed.
        progress (bool): show a progress bar.

    Returns:
        list[dict]: per (size, method, prior) -- sizes larger than the
        set are left out -- with ``size``,
        ``num_subsets``, ``method``, ``prior`` (``E_t``, ``E_b`` or ``-``
        for a method without prior), ``epsilon`` (0 for E_t), the metrics
        averaged over subsets (``nan`` subsets, e.g. no small object, are
        left out) and, for E_b, ``gain_<metric>``.
    """
    if not methods:
        return []
    rows, base = [], {}
    for size in progress_bar(sizes, desc='subsets', enabled=progress):
        subsets = split_subsets(len(methods[0].cache), size, seed)
        if not subsets:  # the size exceeds the number of images
            continue
        results = evaluate_partitions(methods, evaluate, train_prior, subsets,
                                      base)
        for method in methods:
            res = [r for r in results if r['method'] == method.name]
            common = dict(
                size=int(size), num_subsets=len(subsets), method=method.name)
            base_mean = _mean_metrics([r['E_t'] for r in res])
            if not method.takes_prior:
                rows.append(
                    dict(common, prior='-', epsilon=float('nan'), **base_mean))
                continue
            own_mean = _mean_metrics([r['own'] for r in res])
            rows.append(dict(common, prior='E_t', epsilon=0.0, **base_mean))
            rows.append(
                dict(
                    common,
                    prior='E_b',
                    epsilon=float(np.mean([r['epsilon'] for r in res])),
                    **own_mean,
                    **_gains(own_mean, base_mean),
                    seconds=sum(r['seconds'] for r in res)))
    return rows


def group_partitions(
        groups: Sequence[str],
        order: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
    """The image indices of each group, in ``order`` (default: first
    appearance); every group must be in ``order`` and have an image."""
    names = list(order) if order is not None else list(dict.fromkeys(groups))
    unknown = set(groups) - set(names)
    if unknown:
        raise ValueError(f'groups {sorted(unknown)} missing from order')
    groups = np.asarray(groups)
    parts = {name: np.flatnonzero(groups == name) for name in names}
    empty = [name for name, idx in parts.items() if not len(idx)]
    if empty:
        raise ValueError(f'no image of site {empty[0]!r}')
    return parts


def site_priors(
        label_lists: Sequence[np.ndarray],
        groups: Sequence[str],
        num_classes: int,
        order: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
    """E_site of each group (:func:`group_partitions` order): the
    statistics of its images' ground-truth labels."""
    parts = group_partitions(groups, order)
    return dict(
        zip(parts,
            partition_priors(label_lists, list(parts.values()), num_classes)))


def evaluate_groups(
        methods: Sequence[Method],
        evaluate: Callable,
        train_prior: np.ndarray,
        groups: Sequence[str],
        order: Optional[Sequence[str]] = None,
        priors: Optional[Dict[str, np.ndarray]] = None) -> List[Dict]:
    """Per-site evaluation: :func:`evaluate_partitions` on each deployment
    site (a named group of evaluation images) under E_t and under its own
    statistics E_site. A calibratable detector should gain from E_site
    where the site's relations differ from training (large epsilon) and
    lose nothing where they do not.

    Args:
        methods (Sequence[Method]): the detectors.
        evaluate (callable): see :func:`evaluate_partitions`.
        train_prior (np.ndarray): E_t.
        groups (Sequence[str]): the group of each cached image.
        order (Sequence[str], optional): groups in table order (default:
            first appearance).
        priors (dict, optional): E_site of each group, e.g. from
            :func:`site_priors` when the caller needs them too (computed
            here otherwise).

    Returns:
        list[dict]: per (group, method, prior): ``site``, ``num_images``,
        ``method``, ``prior`` (``E_t``, ``E_site`` or ``-``), ``epsilon``
        (MAE(E_site, E_t), the same on every row of a site), the metrics
        and, for E_site, ``gain_<metric>`` over E_t.
    """
    if not methods:
        return []
    if len(groups) != len(methods[0].cache):
        raise ValueError(f'{len(groups)} group labels for '
                         f'{len(methods[0].cache)} cached images')
    parts = group_partitions(groups, order)
    names = list(parts)
    missing = [n for n in names if priors is not None and n not in priors]
    if missing:
        raise ValueError(f'no prior for site {missing[0]!r}')
    rows = []
    for r in evaluate_partitions(
            methods,
            evaluate,
            train_prior,
            list(parts.values()),
            priors=None if priors is None else [priors[n] for n in names]):
        common = dict(
            site=names[r['index']],
            num_images=r['num_images'],
            method=r['method'],
            epsilon=r['epsilon'])
        if r['own'] is None:
            rows.append(dict(common, prior='-', **r['E_t']))
            continue
        rows.append(dict(common, prior='E_t', **r['E_t']))
        rows.append(
            dict(
                common,
                prior='E_site',
                **r['own'],
                **_gains(r['own'], r['E_t']),
                seconds=r['seconds']))
    return rows
