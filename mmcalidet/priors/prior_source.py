# Copyright (c) mmcalidet contributors. All rights reserved.
"""The loaders of a prior as a matrix (the :class:`~mmcalidet.priors.Prior`
made and validated, its matrix returned) and the class names a model
orders priors by.

Light at import (numpy only, like the rest of :mod:`mmcalidet.priors`):
:func:`training_dataset_classes` imports mmengine when called.
"""
import os
from typing import List, Optional, Sequence

import numpy as np

from .prior import Prior
from .prior_io import PriorSource


def load_prior(src: PriorSource,
               classes: Optional[Sequence[str]] = None,
               num_classes: Optional[int] = None,
               reset_diagonal: bool = False,
               return_meta: bool = False):
    """Load and validate a prior.

    Args:
        src (str | PathLike | array-like | dict): a ``.json`` or ``.npy``
            file, a K x K matrix, or a dict in the file format.
        classes (Sequence[str], optional): reorder the matrix by class name
            to this order (needs class names in ``src``). Every name must
            be in the file and every file class in ``classes``.
        num_classes (int, optional): the expected K (checked after
            reordering).
        reset_diagonal (bool): set the diagonal to 1 instead of requiring
            it.
        return_meta (bool): also return the file's class names and extra
            keys.

    Returns:
        np.ndarray | tuple: the K x K float64 matrix, or ``(matrix, meta)``
        with ``meta = {'classes': [...] or None, **extra keys}``.

    Raises:
        ValueError: naming the problem (file missing/empty/malformed,
            shape, K, values, class names).
    """
    prior = Prior.load(
        src,
        classes=classes,
        num_classes=num_classes,
        reset_diagonal=reset_diagonal,
        shipped_names=False)
    matrix = np.array(prior.matrix)
    if return_meta:
        names = None if prior.classes is None else list(prior.classes)
        return matrix, dict(classes=names, **prior.file_keys())
    return matrix


def load_prior_source(src,
                      classes: Optional[Sequence[str]] = None,
                      num_classes: Optional[int] = None,
                      return_meta: bool = False):
    """Load a prior given in a config or by a user, as a matrix.

    The prior is made with :meth:`~mmcalidet.priors.Prior.load` (a support
    it records is validated too); take the :class:`~mmcalidet.priors.Prior`
    itself where the support matters.

    Args:
        src (Prior | str | PathLike | array-like | dict | Tensor): a
            ``.json`` / ``.npy`` file, the name of a prior shipped in
            ``mmcalidet/data/priors`` (e.g. ``'coco2017_train'``), a K x K
            matrix or a dict in the prior file format.
        classes (Sequence[str], optional): reorder a named prior (a JSON
            file or dict with ``classes``) to this class order.
        num_classes (int, optional): the expected K.
        return_meta (bool): also return the file's keys (``classes``: the
            class names of the returned matrix's order, ``None`` for an
            unnamed matrix given no ``classes``; the support's keys).

    Returns:
        np.ndarray | tuple: the validated K x K float64 matrix, or
        ``(matrix, meta)``.

    Raises:
        ValueError: naming the problem (unknown name, missing file, shape,
            values, class names, support).
    """
    prior = Prior.load(src, classes=classes, num_classes=num_classes)
    matrix = np.array(prior.matrix)
    if not return_meta:
        return matrix
    names = None if prior.classes is None else list(prior.classes)
    return matrix, dict(classes=names, **prior.file_keys())


def describe_prior_source(src) -> str:
    """How to name a prior source in an error message: the file or shipped
    name, else ``'the prior'``."""
    if isinstance(src, (str, os.PathLike)):
        return f'prior {os.fspath(src)!r}'
    return 'the prior'


def training_dataset_classes(
        num_classes: Optional[int] = None) -> Optional[List[str]]:
    """The class names of the dataset that a running mmengine training loop
    trains on, else ``None``.

    mmengine's ``RuntimeInfoHook`` (a default hook of every Runner) puts the
    training dataset's ``metainfo`` in the message hub before training and
    marks the loop stage; the runner itself never sets the model's
    ``dataset_meta``. Read only while the stage is ``'train'``, so a message
    hub left from an earlier run does not count. A run that stopped on an
    exception leaves its stage behind (``after_train`` never ran), so with
    ``num_classes`` given, classes of another count are not this model's
    training dataset and are ignored too.

    Args:
        num_classes (int, optional): the model's K; ``None``: no count check.

    Returns:
        list[str] | None: the classes, or ``None`` outside a training run,
        when the dataset has none, or when their count is not
        ``num_classes``.
    """
    from mmengine.logging import MessageHub
    hub = MessageHub.get_current_instance()
    if hub.get_info('loop_stage') != 'train':
        return None
    meta = hub.get_info('dataset_meta')
    classes = meta.get('classes') if isinstance(meta, dict) else None
    if not classes:
        return None
    if num_classes is not None and len(classes) != num_classes:
        return None
    return list(classes)


def model_classes(model) -> Optional[List[str]]:
    """The class names a detector's priors are ordered by: its
    ``dataset_meta['classes']`` (set by ``init_detector`` and the tools),
    else the classes a CaliDet detector was built with, else ``None``.

    Args:
        model (nn.Module): a detector (a plain mmdet one too).

    Returns:
        list[str] | None: the class names.
    """
    meta = getattr(model, 'dataset_meta', None)
    if isinstance(meta, dict) and meta.get('classes'):
        return list(meta['classes'])
    classes = getattr(model, 'classes', None)
    return list(classes) if classes else None
