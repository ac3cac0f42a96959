# Copyright (c) mmcalidet contributors. All rights reserved.
"""Relation statistics: E[i, j] = P(class i present | class j present).

The definitions follow the paper's supplementary ("Calculation of Matrix
E"): the flat prior E0 (0.5 off the diagonal, 1 on it); E_b over a set of
images (E_x for one image, E_t / E_v for a whole dataset) where a class j
that never occurs keeps the flat column 0.5; and the flipped E_x used as a
deliberately misleading prior.
"""
from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from ._cooccurrence import cooccurrence, cooccurrence_lists

LabelList = Union[Sequence[int], np.ndarray]


def _check_num_classes(num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(
            num_classes, (int, np.integer)):
        raise ValueError(
            f'num_classes must be an int, got {type(num_classes).__name__}')
    if num_classes < 1:
        raise ValueError(f'num_classes must be >= 1, got {num_classes}')
    return int(num_classes)


def as_label_array(labels: LabelList, num_classes: int,
                   where: str = 'labels') -> np.ndarray:
    """Check one image's class indices and return them as int64.

    Args:
        labels (Sequence[int] | np.ndarray): class indices (duplicates are
            allowed; order does not matter).
        num_classes (int): K; every index must lie in ``[0, K)``.
        where (str): name used in error messages.

    Returns:
        np.ndarray: 1-D int64 array.

    Raises:
        ValueError: for non-integer values, negative indices or indices
            ``>= num_classes``.
    """
    arr = np.asarray(labels)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f'{where}: class indices must be integers, got '
                         f'dtype {arr.dtype}')
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = arr[~np.isfinite(arr) | (arr != np.round(arr))][0]
            raise ValueError(
                f'{where}: class indices must be integers, got {bad!r}')
    arr = arr.astype(np.int64, copy=False)
    low, high = arr.min(), arr.max()
    if low < 0:
        raise ValueError(f'{where}: class index {low} is negative')
    if high >= num_classes:
        raise ValueError(f'{where}: class index {high} is out of range '
                         f'for num_classes={num_classes}')
    return arr


def flatten_label_lists(
        label_lists: Iterable[LabelList],
        num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Turn per-image label lists into a flat label array and offsets.

    Args:
        label_lists (Iterable): one sequence of class indices per image.
        num_classes (int): K.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``labels`` (int64) and ``offsets``
        (int64, N + 1).
    """
    arrays = []
    lengths = [0]
    for k, labels in enumerate(label_lists):
        arr = np.asarray(labels)
        # numpy turns [2, True] into int64 [2, 1]: a bool among ints would
        # pass as a class index
        if arr.dtype == object or (
                arr.dtype != np.bool_ and isinstance(labels, (list, tuple))
                and any(isinstance(x, (bool, np.bool_)) for x in labels)):
            raise ValueError(f'label_lists[{k}]: class indices must be '
                             f'integers, got {labels!r}')
        arrays.append(arr.reshape(-1))
        lengths.append(arr.size)
    offsets = np.cumsum(np.asarray(lengths, dtype=np.int64))
    if offsets[-1] == 0:
        return np.zeros(0, dtype=np.int64), offsets
    flat = np.concatenate(arrays)
    try:
        flat = as_label_array(flat, num_classes, where='label_lists')
    except ValueError as exc:
        # Name the first offending image for the user.
        for k, arr in enumerate(arrays):
            try:
                as_label_array(arr, num_classes, where=f'label_lists[{k}]')
            except ValueError as inner:
                raise inner from exc
        raise
    return flat, offsets


def flat_prior(num_classes: int) -> np.ndarray:
    """The flat prior E0: 0.5 off the diagonal, 1.0 on it.

    Args:
        num_classes (int): K.

    Returns:
        np.ndarray: K x K float64.
    """
    num_classes = _check_num_classes(num_classes)
    prior = np.full((num_classes, num_classes), 0.5)
    np.fill_diagonal(prior, 1.0)
    return prior


def counts_to_prior(cooc: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """E[i, j] = cooc[i, j] / counts[j]; 0.5 where counts[j] == 0; diag 1.

    Args:
        cooc (np.ndarray): K x K co-presence counts.
        counts (np.ndarray): K presence counts.

    Returns:
        np.ndarray: K x K float64 relation matrix.
    """
    counts = np.asarray(counts, dtype=np.float64)
    prior = np.full(cooc.shape, 0.5)
    present = counts > 0
    prior[:, present] = cooc[:, present] / counts[present]
    np.fill_diagonal(prior, 1.0)
    return prior


def cooccurrence_counts(label_lists: Iterable[LabelList],
                        num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Presence and co-presence counts over images (Cython core).

    Args:
        label_lists (Iterable): one sequence of class indices per image.
        num_classes (int): K.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``C`` (K x K) and ``n`` (K), int64.
    """
    num_classes = _check_num_classes(num_classes)
    if not isinstance(label_lists, (list, tuple)):
        label_lists = list(label_lists)
    # lists / tuples of ints and int64 arrays: read and counted in one pass
    # in Cython; other inputs, and invalid labels (for the error message),
    # go through the flat arrays
    counts = cooccurrence_lists(label_lists, num_classes)
    if counts is not None:
        return counts
    labels, offsets = flatten_label_lists(label_lists, num_classes)
    return cooccurrence(labels, offsets, num_classes)


def counts_from_flat(labels: np.ndarray, offsets: np.ndarray,
                     num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Presence and co-presence counts from a flat label array and offsets
    (no per-image Python loop).

    Args:
        labels (np.ndarray): all images' class indices, concatenated.
        offsets (np.ndarray): N + 1 offsets into ``labels``.
        num_classes (int): K.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``C`` (K x K) and ``n`` (K), int64.
    """
    num_classes = _check_num_classes(num_classes)
    labels = np.asarray(labels)
    if labels.dtype == np.int64 and labels.ndim == 1:
        # the range is checked inside the counting loop (no extra pass)
        labels = np.ascontiguousarray(labels)
    else:
        labels = as_label_array(labels, num_classes)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1:
        raise ValueError('offsets must be a 1-D array of N + 1 entries')
    return cooccurrence(labels, offsets, num_classes)


def prior_from_flat(labels: np.ndarray, offsets: np.ndarray,
                    num_classes: int) -> np.ndarray:
    """E_b from a flat label array and offsets (see :func:`batch_prior`).

    Args:
        labels (np.ndarray): all images' class indices, concatenated.
        offsets (np.ndarray): N + 1 offsets into ``labels``.
        num_classes (int): K.

    Returns:
        np.ndarray: K x K float64.
    """
    return counts_to_prior(*counts_from_flat(labels, offsets, num_classes))


def batch_prior(num_classes: int,
                label_lists: Iterable[LabelList]) -> np.ndarray:
    """E_b: relation statistics over a set of images.

    E_t and E_v are this over a whole dataset, E_x over one image.

    Args:
        num_classes (int): K.
        label_lists (Iterable): one sequence of class indices per image
            (duplicates count once; an empty list is an image with no
            object).

    Returns:
        np.ndarray: K x K float64, ``E[i, j] = #(i and j) / #j``, 0.5 in a
        column whose class never occurs, 1 on the diagonal.
    """
    cooc, counts = cooccurrence_counts(label_lists, num_classes)
    return counts_to_prior(cooc, counts)


def sample_prior(num_classes: int, labels: LabelList) -> np.ndarray:
    """E_x: relation statistics of one image.

    Args:
        num_classes (int): K.
        labels (Sequence[int]): the image's class indices.

    Returns:
        np.ndarray: K x K float64 with 0/1 in the columns of present
        classes, 0.5 in the others, 1 on the diagonal.
    """
    return batch_prior(num_classes, [labels])


def flip_prior(prior: np.ndarray) -> np.ndarray:
    """The misleading prior: 0 <-> 1 off the diagonal.

    On E_x (values 0, 0.5, 1) this is exactly the paper's flip; for a
    general matrix it is ``1 - E`` off the diagonal, which agrees with it
    there. The diagonal stays 1.

    Args:
        prior (np.ndarray): K x K relation matrix in [0, 1].

    Returns:
        np.ndarray: K x K float64.
    """
    from .checks import validate_prior
    prior = validate_prior(prior)
    flipped = 1.0 - prior
    np.fill_diagonal(flipped, 1.0)
    return flipped


def prior_mae(a: np.ndarray, b: np.ndarray,
              exclude_diagonal: bool = False) -> float:
    """Mean absolute difference of two relation matrices.

    The paper's epsilon = sum |E_v - E_t| / K^2 (diagonal included).

    Args:
        a, b (np.ndarray): K x K matrices.
        exclude_diagonal (bool): average over off-diagonal entries only.

    Returns:
        float: the mean absolute error.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f'shape mismatch: {a.shape} vs {b.shape}')
    diff = np.abs(a - b)
    if exclude_diagonal:
        mask = ~np.eye(a.shape[0], dtype=bool)
        return float(diff[mask].mean()) if mask.any() else 0.0
    return float(diff.mean())


def label_lists_prior(label_lists: Iterable[LabelList],
                      num_classes: int,
                      groups: Optional[Sequence[int]] = None) -> np.ndarray:
    """Per-image or per-group priors stacked (B x K x K).

    Args:
        label_lists (Iterable): one sequence of class indices per image.
        num_classes (int): K.
        groups (Sequence[int], optional): group id per image; images of a
            group share E_b of that group. ``None`` gives E_x per image.

    Returns:
        np.ndarray: B x K x K float64.
    """
    label_lists = list(label_lists)
    if groups is None:
        return np.stack(
            [sample_prior(num_classes, labels) for labels in label_lists]) \
            if label_lists else np.zeros((0, num_classes, num_classes))
    if len(groups) != len(label_lists):
        raise ValueError('groups must have one entry per image')
    out = np.empty((len(label_lists), num_classes, num_classes))
    for g in set(groups):
        idx = [k for k, gk in enumerate(groups) if gk == g]
        out[idx] = batch_prior(num_classes, [label_lists[k] for k in idx])
    return out
