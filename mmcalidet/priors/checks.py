# Copyright (c) mmcalidet contributors. All rights reserved.
"""The checks of a prior's matrix and class names: a K x K matrix of
numbers in [0, 1] with diagonal 1 (:func:`validate_prior`), class names
(:func:`check_class_names`) and a matrix reordered by them
(:func:`reorder_prior`), with errors that say what is wrong. Prior files
(:mod:`.prior_io`) and the :class:`~mmcalidet.priors.Prior` value call
them where a prior is made.
"""
import difflib
from collections.abc import Mapping, Set
from typing import Any, List, Optional, Sequence

import numpy as np

from ..utils.validation import check_float

#: the most classes a class list or prior may have (LVIS: 1203, O365: 365)
MAX_CLASSES = 10000


def _close_matches(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f' (did you mean {", ".join(map(repr, close))}?)' if close else ''


def _tensor_to_numpy(tensor) -> np.ndarray:
    """A torch tensor as a numpy array; sparse and meta tensors (no values)
    are refused, half-precision floats (which numpy lacks) widened."""
    if tensor.is_meta:
        raise ValueError('prior is a meta tensor (it holds no values)')
    if str(tensor.layout) != 'torch.strided':
        raise ValueError(f'prior must be a dense tensor, got layout '
                         f'{tensor.layout} (call .to_dense() first)')
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.element_size() < 4:
        tensor = tensor.float()  # bfloat16 has no numpy type
    return tensor.numpy()


def _check_value_types(matrix: Any, raw: np.ndarray) -> None:
    """Refuse what numpy would silently turn into numbers: strings
    (``"0.5"``), booleans and dates.

    Raises:
        ValueError: naming the first such value.
    """
    if isinstance(matrix, (list, tuple)):
        # nested lists (JSON): ``"0.5"`` or ``true`` among numbers
        for i, row in enumerate(matrix):
            for j, value in enumerate(
                    row if isinstance(row, (list, tuple)) else ()):
                if isinstance(value, (str, bytes)):
                    raise ValueError(f'got the string {value!r} at [{i}, '
                                     f'{j}] (values must be numbers)')
                if isinstance(value, (bool, np.bool_)):
                    raise ValueError(f'got the boolean {value} at [{i}, '
                                     f'{j}] (values must be numbers)')
    kind = raw.dtype.kind
    if kind in 'US':
        raise ValueError('got strings (values must be numbers)')
    if kind in 'bMm':
        what = {'b': 'booleans', 'M': 'dates', 'm': 'time spans'}[kind]
        raise ValueError(f'got {what} ({raw.dtype}); values must be numbers')


def validate_prior(matrix: Any,
                   num_classes: Optional[int] = None,
                   reset_diagonal: bool = False,
                   atol: float = 1e-6) -> np.ndarray:
    """Check a relation matrix and return it as a float64 array.

    Args:
        matrix (array-like): the K x K matrix E (E[i, j] = P(i | j)). A
            torch tensor is accepted.
        num_classes (int, optional): the expected K.
        reset_diagonal (bool): set the diagonal to 1 instead of requiring
            it. Defaults to False.
        atol (float): tolerance for the diagonal and the [0, 1] range.

    Returns:
        np.ndarray: K x K float64 (a copy), clipped to [0, 1] within
        ``atol``.

    Raises:
        ValueError: if the matrix is not numeric, not square, of the wrong
            K, has NaN/inf, values outside [0, 1], or a diagonal that is
            not 1.
    """
    check_float('atol', atol, 0)
    if isinstance(matrix, (str, bytes)):
        raise ValueError('prior must be a numeric K x K matrix, got a '
                         'string (pass a path to load_prior instead)')
    if isinstance(matrix, (list, tuple)) and len(matrix) > MAX_CLASSES:
        raise ValueError(f'prior has {len(matrix)} rows, more than the '
                         f'limit of {MAX_CLASSES} classes')
    if hasattr(matrix, 'detach'):  # torch.Tensor
        matrix = _tensor_to_numpy(matrix)
    if np.ma.isMaskedArray(matrix):
        raise ValueError('prior must be a numeric K x K matrix, got a masked '
                         'array (fill its masked values first)')
    try:
        raw = np.asarray(matrix)
        if np.iscomplexobj(raw):
            raise ValueError('got complex values (a real matrix is needed)')
        _check_value_types(matrix, raw)
        # from the original object: numpy names bad strings plainly then
        arr = np.array(
            matrix if raw.dtype.kind == 'O' else raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f'prior must be a numeric K x K matrix: {exc}') from exc
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f'prior must be a square K x K matrix, got shape '
                         f'{tuple(arr.shape)}')
    if arr.shape[0] == 0:
        raise ValueError('prior is empty (K = 0)')
    if num_classes is not None and arr.shape[0] != num_classes:
        raise ValueError(f'prior has K={arr.shape[0]} classes, expected '
                         f'{num_classes}')
    if not np.all(np.isfinite(arr)):
        i, j = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f'prior has a non-finite value {arr[i, j]} at '
                         f'[{i}, {j}]')
    if arr.min() < -atol or arr.max() > 1 + atol:
        bad = np.argwhere((arr < -atol) | (arr > 1 + atol))[0]
        raise ValueError(f'prior values must lie in [0, 1], got '
                         f'{arr[bad[0], bad[1]]:.6g} at [{bad[0]}, '
                         f'{bad[1]}]')
    np.clip(arr, 0.0, 1.0, out=arr)
    diag = np.diagonal(arr)
    if reset_diagonal:
        np.fill_diagonal(arr, 1.0)
    elif np.any(np.abs(diag - 1.0) > atol):
        k = int(np.argmax(np.abs(diag - 1.0)))
        raise ValueError(f'prior diagonal must be 1 (P(i | i) = 1), got '
                         f'{diag[k]:.6g} at [{k}, {k}] (pass '
                         'reset_diagonal=True to set it)')
    else:
        np.fill_diagonal(arr, 1.0)
    return arr


def reorder_prior(matrix: np.ndarray, file_classes: Sequence[str],
                  classes: Sequence[str]) -> np.ndarray:
    """Reorder a prior stored in ``file_classes`` order to ``classes``.

    Args:
        matrix (np.ndarray): K x K matrix in ``file_classes`` order.
        file_classes (Sequence[str]): the names of its rows/columns.
        classes (Sequence[str]): the wanted order (e.g. the model's
            ``dataset_meta['classes']``).

    Names match exactly or, failing that, up to case and ``_`` vs space
    (mmdet's fallback COCO names spell ``traffic_light``, its datasets
    ``traffic light``), when that spelling is unambiguous in both lists.

    Returns:
        np.ndarray: K x K matrix in ``classes`` order.

    Raises:
        ValueError: if a name is duplicated, unknown, or missing.
    """
    file_classes = check_class_names(file_classes, 'prior file classes')
    classes = check_class_names(classes, 'classes')
    index = {name: k for k, name in enumerate(file_classes)}
    if any(name not in index for name in classes):
        loose = [_loose_name(n) for n in file_classes]
        wanted = [_loose_name(n) for n in classes]
        if len(set(loose)) == len(loose) and len(set(wanted)) == len(wanted):
            by_loose = {n: k for k, n in enumerate(loose)}
            index.update({
                name: by_loose[key]
                for name, key in zip(classes, wanted)
                if name not in index and key in by_loose
            })
            file_classes = [
                classes[wanted.index(n)] if n in wanted else f
                for f, n in zip(file_classes, loose)
            ]
    unknown = [name for name in classes if name not in index]
    if unknown:
        name = unknown[0]
        raise ValueError(f'class {name!r} is not in the prior file'
                         f'{_close_matches(name, file_classes)}')
    missing = [name for name in file_classes if name not in set(classes)]
    if missing:
        raise ValueError(f'prior file class {missing[0]!r} is missing from '
                         f'the given classes ({len(classes)} given, '
                         f'{len(file_classes)} in the file)')
    order = np.array([index[name] for name in classes])
    return matrix[np.ix_(order, order)]


def _loose_name(name: str) -> str:
    return ' '.join(name.replace('_', ' ').lower().split())


def check_class_names(classes: Any, what: str = 'classes') -> List[str]:
    """Check a list of class names: strings, non-empty, no duplicates.

    Args:
        classes (Sequence[str]): the names.
        what (str): name used in error messages.

    Returns:
        list[str]: the names.
    """
    if isinstance(classes,
                  (str, bytes)) or not isinstance(classes, (list, tuple)):
        raise ValueError(f'{what} must be a list of class names, got '
                         f'{type(classes).__name__}')
    if not classes:
        raise ValueError(f'{what} is empty')
    if len(classes) > MAX_CLASSES:
        raise ValueError(f'{what}: {len(classes)} class names, more than the '
                         f'limit of {MAX_CLASSES}')
    seen = set()
    for name in classes:
        if not isinstance(name, str) or not name:
            raise ValueError(f'{what}: class names must be non-empty '
                             f'strings, got {name!r}')
        if name in seen:
            raise ValueError(f'{what}: duplicated class name {name!r}')
        seen.add(name)
    return list(classes)


def class_name_list(classes: Any, what: str = 'classes') -> List[str]:
    """Class names given as any ordered sequence (a list, a tuple, an
    array of strings), checked by :func:`check_class_names`. A set, a
    frozenset, a dict or its keys view is refused: the rows of a matrix
    follow its names, and a set's order changes from run to run
    (``PYTHONHASHSEED``).

    Args:
        classes (Sequence[str]): the names, in the order of the rows.
        what (str): name used in error messages.

    Returns:
        list[str]: the names.

    Raises:
        ValueError: unordered names, or what :func:`check_class_names`
            refuses.
    """
    if isinstance(classes, (Set, Mapping)):
        raise ValueError(f'{what} must be an ordered sequence of class '
                         f'names (a list or tuple in the order of the rows), '
                         f'got a {type(classes).__name__}, whose order '
                         'changes from run to run')
    if isinstance(classes, (str, bytes)):
        return check_class_names(classes, what)
    try:
        names = list(classes)
    except TypeError:
        return check_class_names(classes, what)
    return check_class_names(names, what)
