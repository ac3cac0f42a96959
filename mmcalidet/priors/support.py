# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior's support (experimental): the images each column of its matrix
counts (n, ``support``) and each class's share of them (p,
``marginals``), checked as a value (:func:`check_support`) and read from a
prior file's keys (:func:`support_from_keys`: ``images_per_class`` with
``num_images``, or ``support_images`` where the file's ``num_images``
counts something else). :class:`~mmcalidet.priors.Prior` carries it.

Light at import (numpy only), like the rest of :mod:`mmcalidet.priors`.
"""
import math
import numbers
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from .checks import _loose_name

#: the file keys that may record a support (besides the matrix and the
#: class names); ``num_images`` is one only beside ``images_per_class``
SUPPORT_KEYS = ('num_images', 'support_images', 'images_per_class')


def _as_vector(value: Any, k: int, what: str, name: str) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise ValueError(f'{name}: {what} must be numbers, got a string')
    if hasattr(value, 'detach'):  # a tensor
        value = value.detach().cpu().double().numpy()
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f'{name}: {what} must be numbers, got '
                         f'{type(value).__name__}') from None
    if arr.ndim == 0:
        arr = np.full(k, float(arr))
    if arr.shape != (k, ):
        raise ValueError(f'{name}: {what} must have shape ({k},), got '
                         f'{tuple(arr.shape)}')
    if not np.isfinite(arr).all():
        raise ValueError(f'{name}: {what} must be finite (found NaN or '
                         'inf)')
    return arr


def check_support(support, marginals, k: int, name: str) -> tuple:
    """Validate a (support, marginals) pair: both or neither, (K,),
    finite, n >= 0, p in [0, 1].

    Args:
        support: n, the images each column counts ((K,) or a scalar).
        marginals: p, each class's share of them ((K,) or a scalar).
        k (int): K.
        name (str): how errors name the prior.

    Returns:
        tuple: read-only (K,) float64 n and p, or ``(None, None)``.

    Raises:
        ValueError: one of the two without the other, or a bad value,
            named.
    """
    if support is None and marginals is None:
        return None, None
    if support is None:
        raise ValueError(f'{name}: marginals without a support: give both '
                         '(the images each column was measured on and each '
                         "class's share of them) or neither")
    if marginals is None:
        raise ValueError(f'{name}: a support without marginals: give both '
                         '(the images each column was measured on and each '
                         "class's share of them) or neither")
    n = _as_vector(support, k, 'the support', name)
    p = _as_vector(marginals, k, 'the marginals', name)
    if (n < 0).any():
        raise ValueError(f'{name}: the support must be >= 0, got '
                         f'{n[np.argmax(n < 0)]:g}')
    if (p < 0).any() or (p > 1).any():
        bad = p[np.argmax((p < 0) | (p > 1))]
        raise ValueError(f'{name}: the marginals (class shares) must lie '
                         f'in [0, 1], got {bad:g}')
    n.setflags(write=False)
    p.setflags(write=False)
    return n, p


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def support_from_keys(
        meta: Optional[Dict[str, Any]],
        classes: Optional[Sequence[str]],
        where: str = 'prior') -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The (support, marginals) a prior file's keys record, in the order
    of ``classes`` (the file's own class names).

    A file records a support with ``images_per_class`` (a count per class
    name) and ``num_images`` (the images counted), or ``support_images``
    where its ``num_images`` counts other images (a fitted prior). A file
    without ``images_per_class`` records none.

    Args:
        meta (dict, optional): the file's keys besides the matrix and the
            class names.
        classes (Sequence[str], optional): the file's class names.
        where (str): how errors name the prior.

    Returns:
        tuple[np.ndarray, np.ndarray] | None: (K,) n and (K,) p.

    Raises:
        ValueError: one line naming the key: ``images_per_class`` that is
            not a count per class name, a class without a count, a count
            of a name that is no class, a
            missing or bad ``num_images`` / ``support_images``, a count
            above the images counted, or a support in a file without class
            names.
    """
    meta = meta or {}
    if 'images_per_class' not in meta:
        if 'support_images' in meta:
            raise ValueError(f'{where}: support_images without '
                             'images_per_class: a support needs both')
        return None
    counts = meta['images_per_class']
    if not isinstance(counts, dict):
        raise ValueError(f'{where}: images_per_class must map each class '
                         'name to its image count, got '
                         f'{type(counts).__name__}')
    key = 'support_images' if 'support_images' in meta else 'num_images'
    if key not in meta:
        raise ValueError(f'{where}: images_per_class needs num_images (the '
                         'images it counts), which the file lacks')
    if not classes:
        raise ValueError(f'{where}: images_per_class is keyed by class '
                         'name, but the prior has no class names')
    loose = {_loose_name(str(c)): c for c in counts}

    def lookup(table, c, what):
        if c in table:
            return table[c]
        if _loose_name(c) in loose and loose[_loose_name(c)] in table:
            return table[loose[_loose_name(c)]]
        raise ValueError(f'{where}: {what} has no count for {c!r}')

    values = [lookup(counts, c, 'images_per_class') for c in classes]
    # a count of no class (a typo, another dataset's file) is not dropped
    known = {_loose_name(str(c)) for c in classes}
    extra = [c for c in counts if _loose_name(str(c)) not in known]
    if extra:
        raise ValueError(f'{where}: images_per_class counts {extra[0]!r}, '
                         'which is not one of the prior\'s classes')
    bad = [v for v in values if not _is_count(v)]
    if bad:
        raise ValueError(f'{where}: images_per_class must be numbers (image '
                         f'counts), got {bad[0]!r}')
    if not all(math.isfinite(v) and v >= 0 for v in values):
        shown = next(v for v in values if not (math.isfinite(v) and v >= 0))
        raise ValueError(f'{where}: images_per_class must hold finite '
                         f'counts >= 0, got {shown!r}')
    total = meta[key]
    if isinstance(total, dict):
        t_loose = {_loose_name(str(c)): c for c in total}
        totals = []
        for c in classes:
            if c in total:
                totals.append(total[c])
            elif _loose_name(c) in t_loose:
                totals.append(total[t_loose[_loose_name(c)]])
            else:
                raise ValueError(f'{where}: {key} has no count for {c!r}')
    else:
        totals = [total] * len(classes)
    if not all(_is_count(t) and math.isfinite(t) and t > 0 for t in totals):
        shown = next(
            t for t in totals
            if not (_is_count(t) and math.isfinite(t) and t > 0))
        raise ValueError(f'{where}: {key} must be a positive number, got '
                         f'{shown!r}')
    n = np.array(totals, dtype=np.float64)
    c = np.array(values, dtype=np.float64)
    over = c > n * (1 + 1e-9)
    if over.any():
        i = int(np.argmax(over))
        raise ValueError(f'{where}: images_per_class[{classes[i]!r}] '
                         f'exceeds {key} ({n[i]:g})')
    return n, np.clip(c / n, 0.0, 1.0)
