# Copyright (c) mmcalidet contributors. All rights reserved.
"""The images given to :func:`~mmcalidet.apis.inference_detector`, checked
before the model runs: each refusal is one line naming the input (an empty
list, a mix of files and arrays, a missing, empty or broken file, an array
that is not a non-empty H x W x 3 image, or one holding NaN or an
infinity)."""
import os
from typing import Any, List

import numpy as np

from ..utils.image_files import MAX_PIXELS, check_image
from ..utils.validation import check_finite_array


def _name(k: int, count: int, is_batch: bool) -> str:
    return f'image {k} of {count}' if is_batch else 'the image'


def _check_array(image: np.ndarray, what: str) -> None:
    if image.dtype.kind not in 'biuf':
        raise ValueError(f'{what} must be an array of numbers (a BGR image), '
                         f'got dtype {image.dtype}')
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f'{what} must be an H x W x 3 (BGR) array, got '
                         f'shape {tuple(image.shape)}')
    if image.size == 0:
        raise ValueError(f'{what} is empty (shape {tuple(image.shape)})')
    check_finite_array(image, what)


def _check_file(path: str, what: str) -> None:
    if '://' in path:  # a URL or a storage backend: read by mmengine
        return
    if not os.path.exists(path):
        raise ValueError(f'{what}: image file not found: {path}')
    if not os.path.isfile(path):
        raise ValueError(f'{what}: not a file: {path}')
    if os.path.getsize(path) == 0:
        raise ValueError(f'{what}: image file is empty: {path}')
    reason = check_image(path, MAX_PIXELS)
    if reason is not None:
        raise ValueError(f'{what}: {path}: {reason}')


def check_inference_images(imgs: Any) -> List[Any]:
    """Check what ``inference_detector`` is given as images.

    Args:
        imgs (str | PathLike | np.ndarray | Sequence): one image (a file
            or a BGR H x W x 3 array) or a list/tuple of them, all files
            or all arrays (mmdet builds one pipeline for them all).

    Returns:
        list: the images, as a list.

    Raises:
        ValueError: one line naming the input: no images, files mixed with
            arrays, something that is neither, a file that is missing,
            empty or not a readable image, an array that is not a non-empty
            H x W x 3 array of numbers, or one holding NaN or an infinity.
    """
    is_batch = isinstance(imgs, (list, tuple))
    images = list(imgs) if is_batch else [imgs]
    if not images:
        raise ValueError('no images given (an empty list): pass image files '
                         'or H x W x 3 arrays')
    kinds = []
    for k, image in enumerate(images):
        what = _name(k, len(images), is_batch)
        if isinstance(image, (str, os.PathLike)):
            kinds.append('file')
            _check_file(os.fspath(image), what)
        elif isinstance(image, np.ndarray):
            kinds.append('array')
            _check_array(image, what)
        else:
            raise ValueError(f'{what} must be an image file or an H x W x 3 '
                             f'array, got {type(image).__name__}')
        if kinds[k] != kinds[0]:
            kind = {'file': 'a file', 'array': 'an array'}
            raise ValueError(f'the images mix files and arrays (image 0 is '
                             f'{kind[kinds[0]]}, image {k} {kind[kinds[k]]}):'
                             ' pass one kind per call')
    return images
