# Copyright (c) mmcalidet contributors. All rights reserved.
"""Subset evaluation (the paper's Sec. 4.3, Tab. 3) and its epsilon.

The evaluation set is split into equal, non-overlapping random subsets:
``perm = numpy.random.default_rng(seed).permutation(N)``, subset ``k`` of
size ``s`` is ``perm[k * s:(k + 1) * s]`` for ``k < N // s`` (the
remainder is left out). Per subset the model is evaluated under E_t and
under the subset's own statistics E_b; metrics are averaged over the
subsets of a size, and ``epsilon = mean over subsets of MAE(E_b, E_t)``.

With the images of COCO val2017 ordered as the image-level label files
list them (sorted by id) followed by the 48 images without labels, seed 0
and 80 classes this gives epsilon = .374 / .312 / .230 / .141 / .074 /
.043 for sizes 8 ... 256, the figures of ``../shared/paper/notes.md``
(the paper's .331 / .276 / ... come from DINO's 91 id slots).
"""
import json
import os.path as osp
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..priors import batch_prior, prior_mae
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
    from tqdm import tqdm
    k = train_prior.shape[0]
    rows = []
    for size in tqdm(sizes, desc='epsilon', disable=not progress, leave=False):
        maes = [
            prior_mae(
                batch_prior(k, [label_lists[i] for i in idx]), train_prior)
            for idx in split_subsets(len(label_lists), size, seed)
        ]
        rows.append(
            dict(
                size=int(size),
                num_subsets=len(maes),
                epsilon=float(np.mean(maes)) if maes else float('nan'),
                epsilon_std=float(np.std(maes)) if maes else float('nan')))
    return rows


def _read_image_list(path: str) -> List[str]:
    """Image names from a JSON object / list (e.g.
    ``val2017_image_sizes.json``) or a text file, one per line."""
    from ..utils.file_io import check_readable_file, load_json
    if path.endswith('.json'):
        data = load_json(path, 'image list')
        if isinstance(data, dict):
            return list(data)
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return data
        raise ValueError(f'image list {path}: expected a JSON object keyed '
                         'by image name or a list of names')
    check_readable_file(path, what='image list')
    with open(path, encoding='utf-8') as f:
        return [line.strip() for line in f if line.strip()]


def _stem(name: str) -> str:
    return osp.splitext(osp.basename(name))[0]


def read_evaluation_labels(
    src: str,
    classes=None,
    image_list: Optional[str] = None
) -> Tuple[List[np.ndarray], List[str], List[str]]:
    """Image-level labels of an evaluation set, in the order the subset
    split uses.

    Args:
        src (str): a COCO annotation JSON (every image listed, in file
            order) or YOLO labels (a folder or ``.tar.gz``; one file per
            labelled image, in the reader's sorted order).
        classes (str | Sequence[str], optional): class names (a classes
            file or list); required for YOLO labels.
        image_list (str, optional): all image names (e.g.
            ``val2017_image_sizes.json``); images without a label file are
            appended, sorted by name, as images with no object.

    Returns:
        tuple: ``(label_lists, image_names, classes)``.
    """
    from ..priors.dataset_prior import is_yolo_source
    from ..priors.label_io import (read_class_names, read_coco_labels,
                                   read_yolo_dir, read_yolo_tarball)
    if isinstance(classes, str):
        classes = read_class_names(classes)
    if is_yolo_source(src):
        if classes is None:
            raise ValueError('YOLO labels carry no class names: pass '
                             'classes')
        sets = read_yolo_dir(src, classes) if osp.isdir(src) else \
            read_yolo_tarball(src, classes, keep_names=True)
        names = [_stem(f) for f in sets.extra['files']]
    else:
        sets = read_coco_labels(src, classes)
        with open(src, encoding='utf-8') as f:
            names = [
                _stem(img.get('file_name', str(img['id'])))
                for img in json.load(f)['images']
            ]
    label_lists = sets.label_lists()
    if image_list is not None:
        known = set(names)
        listed = [_stem(n) for n in _read_image_list(image_list)]
        unlisted = known - set(listed)
        if unlisted:
            raise ValueError(f'{len(unlisted)} labelled images are not in '
                             f'the image list, e.g. {sorted(unlisted)[0]}')
        empty = sorted(set(listed) - known)
        names = names + empty
        label_lists = label_lists + [np.zeros(0, np.int64)] * len(empty)
    return label_lists, names, list(sets.classes or classes)


def _mean_metrics(per_subset: List[Dict]) -> Dict[str, float]:
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
    """Subset evaluation of cached detectors.

    Args:
        methods (Sequence[Method]): the detectors (all caches hold the same
            images in the same order).
        evaluate (callable): ``evaluate(cache, predictions, indices) ->
            metrics`` on the images ``indices`` of the cache.
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
    from tqdm import tqdm
    if not methods:
        return []
    cache = methods[0].cache
    labels = cache.gt_label_lists()
    k = train_prior.shape[0]
    rows = []
    jobs = [(size, m) for size in sizes for m in methods]
    base_preds = {}
    for size, method in tqdm(
            jobs,
            desc='subsets',
            disable=not progress,
            leave=False,
            dynamic_ncols=True):
        start = time.perf_counter()
        subsets = split_subsets(len(cache), size, seed)
        if method.name not in base_preds:
            # E_t (or no prior) does not depend on the split: score once
            base_preds[method.name] = method.rescorer.predict(
                train_prior if method.takes_prior else None)
        base = base_preds[method.name]
        base_rows, eb_rows, eps = [], [], []
        for idx in subsets:
            base_rows.append(evaluate(cache, [base[i] for i in idx], idx))
            if not method.takes_prior:
                continue
            prior = batch_prior(k, [labels[i] for i in idx])
            eps.append(prior_mae(prior, train_prior))
            eb_rows.append(
                evaluate(cache, method.rescorer.predict(prior, idx), idx))
        if not subsets:  # the size exceeds the number of images
            continue
        common = dict(
            size=int(size), num_subsets=len(subsets), method=method.name)
        base_mean = _mean_metrics(base_rows)
        rows.append(
            dict(
                common,
                prior='E_t' if method.takes_prior else '-',
                epsilon=0.0 if method.takes_prior else float('nan'),
                **base_mean))
        if method.takes_prior:
            eb_mean = _mean_metrics(eb_rows)
            rows.append(
                dict(
                    common,
                    prior='E_b',
                    epsilon=float(np.mean(eps)),
                    **eb_mean,
                    **{
                        f'gain_{m}': eb_mean[m] - base_mean[m]
                        for m in METRICS
                    },
                    seconds=time.perf_counter() - start))
    return rows
