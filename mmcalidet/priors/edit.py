# Copyright (c) mmcalidet contributors. All rights reserved.
"""Edit a prior in words: ``"sprite|coke=0.0"`` sets P(sprite | coke).

An edit reads ``"<class i>|<class j>=<value>"``: the probability that class
i is present given that class j is present. ``*`` stands for every class
on that side (the diagonal is never changed: P(i | i) stays 1).
"""
import os
from typing import List, Sequence, Tuple

import numpy as np

from .checks import _close_matches, class_name_list, validate_prior
from .prior import Prior

Edit = Tuple[str, str, float]

#: the keys that describe the images a prior was measured on: an edited
#: matrix was measured on none, so an edit drops them with the support
MEASURED_KEYS = ('num_images', 'images_with_labels')


def parse_edit(text: str) -> Edit:
    """Parse ``"<class i>|<class j>=<value>"``.

    Args:
        text (str): the edit; class names may contain spaces
            (``"baseball glove|person=0.1"``).

    Returns:
        tuple: ``(class_i, class_j, value)``.

    Raises:
        ValueError: if the text is malformed or the value is not a number
            in [0, 1].
    """
    if not isinstance(text, str) or '=' not in text or '|' not in text:
        raise ValueError(f'edit {text!r} must read "<class i>|<class j>='
                         '<value>", e.g. "sprite|coke=0.0"')
    pair, _, value_text = text.rpartition('=')
    class_i, sep, class_j = pair.partition('|')
    class_i, class_j = class_i.strip(), class_j.strip()
    if not class_i or not class_j or '|' in class_j:
        raise ValueError(f'edit {text!r}: expected exactly one "|" between '
                         'two class names')
    try:
        value = float(value_text)
    except ValueError as exc:
        raise ValueError(f'edit {text!r}: {value_text.strip()!r} is not a '
                         'number') from exc
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f'edit {text!r}: the value must lie in [0, 1]')
    return class_i, class_j, value


def _indices(name: str, classes: Sequence[str], text: str) -> List[int]:
    if name == '*':
        return list(range(len(classes)))
    try:
        return [list(classes).index(name)]
    except ValueError:
        raise ValueError(f'edit {text!r}: unknown class {name!r}'
                         f'{_close_matches(name, classes)}') from None


def apply_edits(matrix: np.ndarray, classes: Sequence[str],
                edits: Sequence[str]) -> np.ndarray:
    """Apply edits to a prior (in order; later edits win).

    Args:
        matrix (np.ndarray): the K x K prior in ``classes`` order.
        classes (Sequence[str]): the class names.
        edits (Sequence[str]): edits as :func:`parse_edit` reads them.

    Returns:
        np.ndarray: the edited copy (validated; the input is unchanged).

    Raises:
        ValueError: on a malformed edit, an unknown class name (with close
            matches) or an edit of the diagonal.
    """
    classes = class_name_list(classes)
    out = validate_prior(matrix, num_classes=len(classes))
    for text in edits:
        name_i, name_j, value = parse_edit(text)
        rows = _indices(name_i, classes, text)
        cols = _indices(name_j, classes, text)
        if name_i == name_j != '*':
            raise ValueError(f'edit {text!r}: P(i | i) is always 1')
        for i in rows:
            for j in cols:
                if i != j:
                    out[i, j] = value
    return out


def edit_prior(prior: Prior, edits: Sequence[str]) -> Prior:
    """A prior with edits applied: the matrix edited, the support dropped.

    An edited matrix was not measured on the images the source's support
    counts: a support-aware CaliFormer would read it as measured on them
    (on COCO's E_t, 117,266 images). The edit keeps the class names and
    the descriptive keys, drops the support and the keys that count images
    (:data:`MEASURED_KEYS`), and records ``base`` (the source's name) and
    ``edits``.

    Args:
        prior (Prior): the named prior to edit.
        edits (Sequence[str]): edits as :func:`parse_edit` reads them.

    Returns:
        Prior: the edited prior, without a support.

    Raises:
        ValueError: a prior without class names, or a bad edit (see
            :func:`apply_edits`).
    """
    if prior.classes is None:
        raise ValueError(f'{prior.name} has no class names to edit by')
    matrix = apply_edits(prior.matrix, prior.classes, edits)
    meta = {k: v for k, v in prior.meta.items() if k not in MEASURED_KEYS}
    meta.update(base=os.path.basename(prior.name), edits=list(edits))
    return Prior(matrix, prior.classes, meta=meta, name=prior.name)
