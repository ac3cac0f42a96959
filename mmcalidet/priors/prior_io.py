# Copyright (c) mmcalidet contributors. All rights reserved.
"""Prior files: read (size-checked), load (reordered by class name), save
atomically; the matrix and class-name checks are :mod:`.checks`'.

A prior file is JSON::

    {"classes": ["person", "bicycle", ...],
     "matrix": [[1.0, 0.12, ...], ...],
     ...any metadata (source, num_images, ...)}

``.npy`` files (a bare K x K array, no class names) are accepted too.
"""
import json
import os
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..utils.file_io import atomic_write, check_readable_file, load_json
from ..utils.validation import check_int
from .checks import check_class_names, class_name_list, validate_prior

PriorSource = Union[str, os.PathLike, np.ndarray, Sequence, Dict[str, Any]]

#: prior files are small (K=80: ~100 kB); refuse anything huge
MAX_PRIOR_FILE_BYTES = 64 * 1024 * 1024
#: where the expected K is known, a JSON prior file may hold at most this
#: many bytes per matrix value (save_prior writes ~20) ...
PRIOR_BYTES_PER_VALUE = 64
#: ... plus this much for the class names and metadata
PRIOR_FILE_SLACK_BYTES = 1024 * 1024


def _max_prior_file_bytes(num_classes: Optional[int]) -> int:
    """The size limit of a prior file of ``num_classes`` classes."""
    if num_classes is None:
        return MAX_PRIOR_FILE_BYTES
    return min(MAX_PRIOR_FILE_BYTES,
               PRIOR_BYTES_PER_VALUE * num_classes**2 + PRIOR_FILE_SLACK_BYTES)


def _npy_shape(path: str) -> tuple:
    """The array shape in a ``.npy`` header (the data is not read)."""
    with open(path, 'rb') as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, _ = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, _ = np.lib.format.read_array_header_2_0(f)
    return tuple(shape)


def _read_prior_file(
    path: str,
    num_classes: Optional[int] = None
) -> Tuple[Any, Optional[List[str]], dict]:
    check_readable_file(path, MAX_PRIOR_FILE_BYTES, what='prior file')
    max_bytes = _max_prior_file_bytes(num_classes)
    size = os.path.getsize(path)
    if size > max_bytes:  # e.g. a K = 5700 prior for an 80-class model
        raise ValueError(f'prior file is too large for K={num_classes} '
                         f'classes ({size} bytes > limit {max_bytes}): '
                         f'{path}')
    if path.endswith('.npy'):
        try:
            shape = _npy_shape(path)
        except Exception as exc:  # numpy raises several types
            raise ValueError(f'cannot read prior file {path}: {exc}') from exc
        if num_classes is not None and len(shape) == 2 and \
                shape[0] == shape[1] != num_classes:
            # from the header: the data is not read
            raise ValueError(f'{path}: prior has K={shape[0]} classes, '
                             f'expected {num_classes}')
        try:
            matrix = np.load(path, allow_pickle=False)
        except Exception as exc:  # numpy raises several types
            raise ValueError(f'cannot read prior file {path}: {exc}') from exc
        return matrix, None, {}
    data = load_json(path, 'prior file', MAX_PRIOR_FILE_BYTES)
    return _split_prior_dict(data, path)


def _split_prior_dict(data: Any,
                      where: str) -> Tuple[Any, Optional[List[str]], dict]:
    if not isinstance(data, dict):
        raise ValueError(f'{where}: a prior file must hold a JSON object '
                         '{"classes": [...], "matrix": [[...]]}, got '
                         f'{type(data).__name__}')
    if 'matrix' not in data:
        raise ValueError(f'{where}: no "matrix" key')
    matrix = data['matrix']
    if isinstance(matrix, str):
        raise ValueError(f'{where}: "matrix" must be a list of rows, got a '
                         'string')
    classes = data.get('classes')
    if classes is not None:
        classes = check_class_names(classes, f'{where}: "classes"')
    meta = {k: v for k, v in data.items() if k not in ('matrix', 'classes')}
    return matrix, classes, meta


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f'{type(obj).__name__} is not JSON serialisable')


def check_json_keys(keys: Dict[str, Any], where: str) -> None:
    """Refuse a prior file key whose value is not finite JSON (NaN, inf,
    an object), naming the key.

    Raises:
        ValueError: ``<where>: the file key 'k' cannot be written ...``.
    """
    for key, value in keys.items():
        try:
            json.dumps(value, allow_nan=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise ValueError(f'{where}: the file key {key!r} cannot be '
                             f'written as JSON ({exc})') from None


def save_prior(path: Union[str, os.PathLike],
               matrix: Any,
               classes: Optional[Sequence[str]] = None,
               decimals: Optional[int] = None,
               **meta) -> str:
    """Validate and write a prior file atomically.

    Args:
        path (str | PathLike): ``.json`` (with class names) or ``.npy``.
        matrix (array-like): the K x K matrix.
        classes (Sequence[str], optional): the K class names (required for
            ``.json``).
        decimals (int, optional): round the stored values (an integer
            >= 0: fewer places would round the diagonal away).
        **meta: extra JSON keys (source, num_images, ...).

    Returns:
        str: the path written.
    """
    path = os.fspath(path)
    decimals = check_int('save_prior: decimals', decimals, 0, allow_none=True)
    arr = validate_prior(matrix)
    if path.endswith('.npy'):
        with atomic_write(path, 'wb') as f:
            np.save(f, arr)
        return path
    if classes is None:
        raise ValueError('save_prior: class names are required for a JSON '
                         'prior file')
    classes = class_name_list(classes)
    if len(classes) != arr.shape[0]:
        raise ValueError(f'save_prior: {len(classes)} class names for a '
                         f'{arr.shape[0]} x {arr.shape[0]} matrix')
    for key in ('classes', 'matrix'):
        if key in meta:
            raise ValueError(f'save_prior: {key!r} is reserved')
    check_json_keys(meta, 'save_prior')
    rows = np.round(arr, decimals) if decimals is not None else arr
    head = json.dumps(
        dict(classes=classes, **meta), default=_json_default, allow_nan=False)
    # one matrix row per line keeps diffs of edited priors readable
    body = ',\n'.join('  ' + json.dumps([float(v) for v in row])
                      for row in rows)
    text = head[:-1] + ', "matrix": [\n' + body + '\n]}\n'
    with atomic_write(path, 'w', encoding='utf-8') as f:
        f.write(text)
    return path


#: a bare name such as ``'coco2017_train'`` (no folder, no extension)
_SHIPPED_NAME = re.compile(r'[A-Za-z0-9_\-]+')


def resolve_shipped_name(src) -> str:
    """A prior path as given, or the file of a shipped prior's bare name
    (``'coco2017_train'``) where no such path exists.

    Raises:
        ValueError: an unknown shipped name, or a string that looks like a
            matrix.
    """
    path = os.fspath(src)
    if not osp.exists(path):
        if _SHIPPED_NAME.fullmatch(path):
            return default_prior_path(path)
        if path.lstrip().startswith('['):
            raise ValueError(
                'prior: got a string that looks like a matrix; pass the '
                'matrix itself (a list or an array) or a file path')
    return path


def default_prior_path(name: str) -> str:
    """Path of a prior shipped in ``mmcalidet/data/priors``.

    Args:
        name (str): e.g. ``'coco2017_train'``.

    Returns:
        str: the file path.
    """
    here = osp.dirname(osp.dirname(osp.abspath(__file__)))
    path = osp.join(here, 'data', 'priors', f'{name}.json')
    if not osp.isfile(path):
        shipped = sorted(
            f[:-5] for f in os.listdir(osp.dirname(path))
            if f.endswith('.json')) if osp.isdir(osp.dirname(path)) else []
        raise ValueError(f'no shipped prior {name!r}; shipped: {shipped}')
    return path
