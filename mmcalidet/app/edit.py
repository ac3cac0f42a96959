# Copyright (c) mmcalidet contributors. All rights reserved.
"""Edit a prior in words on the page, as ``tools/misc/edit_prior.py
--set`` does, and show the edit.

The edits are :func:`mmcalidet.priors.edit.edit_prior`'s (``"i|j=v"``:
P(i present | j present) = v, ``*`` every class); marking a class absent
at the site is the edit ``"<class>|*=0"`` (it appears with no class).
The edited prior is written by the same writer as ``edit_prior.py``
(:meth:`~mmcalidet.priors.Prior.save`). Its support (what the matrix was
measured on) is kept only where the edit leaves it true: edits that
change no entry keep the prior as it was, any other drops it, as
``edit_prior`` does.
"""
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..priors.edit import MEASURED_KEYS, edit_prior, parse_edit
from ..priors.prior import Prior


def pair_edit(class_i: str, class_j: str, value: float) -> str:
    """The edit that sets P(``class_i`` | ``class_j``) = ``value``.

    Raises:
        ValueError: a value outside [0, 1], a class paired with itself.
    """
    text = f'{class_i}|{class_j}={float(value):g}'
    parse_edit(text)  # the value's check
    if class_i == class_j and class_i != '*':
        raise ValueError(f'edit {text!r}: P(i | i) is always 1')
    return text


def absent_edits(classes: Sequence[str]) -> List[str]:
    """The edits that mark classes absent at the site: P(c | j) = 0 for
    every other class j (the column of ``c``, P(. | c), is left as it is:
    an absent class's column is never read as evidence)."""
    return [f'{c}|*=0' for c in classes]


def read_edits(text: str) -> List[str]:
    """The edits of a text box: one per line (``#`` starts a comment)."""
    lines = (
        line.split('#', 1)[0].strip() for line in (text or '').splitlines())
    return [line for line in lines if line]


def apply_page_edits(
        base: Prior,
        edits: Sequence[str],
        absent: Optional[Sequence[str]] = None) -> Tuple[Prior, str]:
    """The base prior with the page's edits, and one line on what it did.

    Args:
        base (Prior): the prior to edit (with class names).
        edits (Sequence[str]): ``"i|j=v"`` edits, in order.
        absent (Sequence[str]): classes to mark absent (applied last).

    Returns:
        tuple[Prior, str]: the edited prior (the base itself when no entry
        changed, its support kept) and the line.

    Raises:
        ValueError: one line naming a malformed edit or an unknown class
            (with close matches).
    """
    edits = list(edits) + absent_edits(absent or ())
    if not edits:
        raise ValueError('nothing to do: add an edit "I|J=V" or mark a class '
                         'absent')
    edited = edit_prior(base, edits)
    changed = int((edited.matrix != base.matrix).sum())
    if changed == 0:
        return base, (f'{len(edits)} edits, no entry changed: {base.name} '
                      'kept as it is (its support too)')
    line = f'{len(edits)} edits, {changed} entries changed'
    dropped = [k for k in MEASURED_KEYS if k in base.meta]
    if base.has_support:
        dropped = ['num_images', 'images_per_class'
                   ] + [k for k in dropped if k != 'num_images']
    if dropped:
        line += (f'; not kept: {", ".join(dropped)} (the edited matrix was '
                 'not measured on those images)')
    return edited.renamed('edited'), line


def write_prior(prior: Prior,
                folder: str,
                file_name: str = 'edited_prior.json') -> str:
    """Write a prior file as ``edit_prior.py`` writes it.

    Args:
        prior (Prior): the prior (with class names).
        folder (str): the folder (created).
        file_name (str): the file name.

    Returns:
        str: the path written.
    """
    os.makedirs(folder, exist_ok=True)
    return prior.save(os.path.join(folder, file_name))


def difference_figure(prior: Prior, train: Prior, title: Optional[str] = None):
    """A heatmap of E - E_t (rows i, columns j: P(i | j)).

    Args:
        prior (Prior): E.
        train (Prior): E_t, in the same class order.
        title (str, optional): the figure title.

    Returns:
        matplotlib.figure.Figure: the figure.
    """
    from matplotlib.figure import Figure
    diff = np.asarray(prior.matrix) - np.asarray(train.matrix)
    k = diff.shape[0]
    size = min(9.0, 3.5 + 0.12 * k)
    fig = Figure(figsize=(size + 1.2, size), dpi=90)
    ax = fig.add_subplot(1, 1, 1)
    limit = max(float(np.abs(diff).max()), 1e-6)
    image = ax.imshow(diff, cmap='RdBu_r', vmin=-limit, vmax=limit)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    classes = list(prior.classes or range(k))
    if k <= 40:
        ax.set_xticks(range(k), classes, rotation=90, fontsize=7)
        ax.set_yticks(range(k), classes, fontsize=7)
    ax.set_xlabel('j (given present)')
    ax.set_ylabel('i')
    ax.set_title(title or f'E - E_t ({int((diff != 0).sum())} entries '
                 'changed)')
    fig.tight_layout()
    return fig
