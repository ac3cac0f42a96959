# Copyright (c) mmcalidet contributors. All rights reserved.
"""The support a prior file records beside its matrix (experimental, read
by a CaliFormer with ``support_features`` / ``lift_bias``).

A prior file written by ``tools/analysis_tools/compute_prior.py`` (or the
context-shift data) keeps ``num_images`` and ``images_per_class``: every
column of its matrix was measured on ``num_images`` images (n), and class
c is in ``images_per_class[c] / num_images`` of them (p). Those are the
support and class shares the support-aware CaliFormer reads, so a prior
file carries them wherever its matrix goes (``set_prior``,
``init_detector`` / ``inference_detector(prior=...)``).
"""
from typing import Optional, Sequence, Tuple

import numpy as np

from .prior_io import _loose_name


def support_from_meta(
        meta: Optional[dict],
        classes: Optional[Sequence[str]],
        where: str = 'prior') -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The (support, class shares) a prior file's keys record.

    Args:
        meta (dict, optional): the file's keys besides the matrix
            (``load_prior(..., return_meta=True)``).
        classes (Sequence[str], optional): the class order of the returned
            arrays (the model's, after reordering the matrix).
        where (str): the prior's name, for errors.

    Returns:
        tuple[np.ndarray, np.ndarray] | None: (K,) n = ``num_images`` (or
        ``support_images`` where the file has it) for every column and
        (K,) p = ``images_per_class[c] / n``;
        ``None`` when the file records no support (no ``images_per_class``
        by class name, no ``num_images``, or no class names to match them).

    Raises:
        ValueError: a recorded support that cannot be right (a count that
            is not a finite non-negative number, a class without a count,
            or more images of a class than images in all).
    """
    meta = meta or {}
    counts = meta.get('images_per_class')
    # a fitted prior records the support it was scored with apart from the
    # images it was fitted on (fit_site_prior: E_t's for alpha 0)
    total = meta.get('support_images', meta.get('num_images'))
    if not isinstance(counts, dict) or total is None or not classes:
        return None
    # names match as the matrix's do: exactly, else up to case and '_'
    # vs space (reorder_prior)
    loose = {_loose_name(str(name)): name for name in counts}
    missing = [
        c for c in classes if c not in counts and _loose_name(c) not in loose
    ]
    if missing:
        raise ValueError(f'{where}: images_per_class has no count for '
                         f'{missing[0]!r}')
    try:
        total = float(total)
        values = np.array([
            counts.get(c, counts.get(loose.get(_loose_name(c))))
            for c in classes
        ],
                          dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f'{where}: num_images and images_per_class must '
                         'be numbers') from None
    if not np.isfinite(total) or total <= 0:
        raise ValueError(f'{where}: num_images must be a positive number, '
                         f'got {meta.get("num_images")!r}')
    if not np.isfinite(values).all() or (values < 0).any():
        raise ValueError(f'{where}: images_per_class must hold finite '
                         'counts >= 0')
    if (values > total).any():
        name = classes[int(np.argmax(values > total))]
        raise ValueError(f'{where}: images_per_class[{name!r}] exceeds '
                         f'num_images ({total:g})')
    return np.full(len(classes), total), values / total
