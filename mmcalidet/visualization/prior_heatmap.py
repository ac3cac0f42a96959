# Copyright (c) mmcalidet contributors. All rights reserved.
"""Heatmaps of relation matrices (the paper's E_t / E_v / E_v - E_t
figure)."""
import os
from typing import Optional, Sequence

import numpy as np

from ..utils.file_io import atomic_write


def _pyplot():
    import matplotlib
    matplotlib.use('Agg', force=False)
    import matplotlib.pyplot as plt
    return plt


def _draw(ax, matrix: np.ndarray, title: str, diff: bool,
          classes: Optional[Sequence[str]]) -> None:
    if diff:
        lim = max(float(np.abs(matrix).max()), 1e-6)
        im = ax.imshow(matrix, cmap='RdBu_r', vmin=-lim, vmax=lim,
                       interpolation='nearest')
    else:
        im = ax.imshow(matrix, cmap='viridis', vmin=0.0, vmax=1.0,
                       interpolation='nearest')
    ax.set_title(title)
    ax.set_xlabel('j (given class)')
    ax.set_ylabel('i (class present)')
    k = matrix.shape[0]
    if classes is not None and k <= 30:
        ax.set_xticks(range(k))
        ax.set_xticklabels(classes, rotation=90, fontsize=6)
        ax.set_yticks(range(k))
        ax.set_yticklabels(classes, fontsize=6)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def _save(fig, path: str) -> str:
    with atomic_write(path, 'wb') as f:
        fig.savefig(f, format='png', dpi=120)
    _pyplot().close(fig)
    return path


def plot_prior(matrix: np.ndarray,
               path: str,
               title: str = 'E[i, j] = P(i | j)',
               classes: Optional[Sequence[str]] = None,
               diff: bool = False) -> str:
    """Write a heatmap PNG of one K x K matrix.

    Args:
        matrix (np.ndarray): the matrix (a prior, or a difference).
        path (str): the PNG to write (atomically).
        title (str): the title.
        classes (Sequence[str], optional): tick labels (used for K <= 30).
        diff (bool): a signed difference (diverging colour map).

    Returns:
        str: ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 5), layout='constrained')
    _draw(ax, np.asarray(matrix, dtype=float), title, diff, classes)
    return _save(fig, os.fspath(path))


def plot_prior_comparison(a: np.ndarray,
                          b: np.ndarray,
                          path: str,
                          names: Sequence[str] = ('A', 'B'),
                          classes: Optional[Sequence[str]] = None) -> str:
    """Write A, B and B - A side by side (the paper's Fig. of E_t, E_v).

    Args:
        a, b (np.ndarray): K x K matrices.
        path (str): the PNG to write.
        names (Sequence[str]): titles of ``a`` and ``b``.
        classes (Sequence[str], optional): tick labels.

    Returns:
        str: ``path``.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(18, 5), layout='constrained')
    _draw(axes[0], a, names[0], False, classes)
    _draw(axes[1], b, names[1], False, classes)
    _draw(axes[2], b - a, f'{names[1]} - {names[0]}', True, classes)
    return _save(fig, os.fspath(path))
