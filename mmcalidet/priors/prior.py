# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior value: a relation matrix with its class names and, where it
was measured on images, its support.

A :class:`Prior` is validated once, where it is made (a file, a dict, an
array, a checkpoint, a fit, an edit), and carried whole from there: the
detector, the inference APIs, the export, the ONNX runtime, the baselines
and the tools take a ``Prior`` or make one through :meth:`Prior.load`.

The support (experimental; read by a CaliFormer with ``support_features``
or ``lift_bias``) is what the matrix was measured on: the images each
column counts (n, ``support``) and each class's share of them (p,
``marginals``). A prior file records it as ``num_images`` (or
``support_images`` where the file's ``num_images`` counts something else,
as a fitted prior's does) and ``images_per_class``. A support is read
whole or refused in one line that names the key: never dropped
(:mod:`.support`).

Light at import (numpy only), like the rest of :mod:`mmcalidet.priors`.
"""
import os
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from .checks import _loose_name, class_name_list, reorder_prior, validate_prior
from .prior_io import (_read_prior_file, _split_prior_dict, check_json_keys,
                       resolve_shipped_name, save_prior)
from .support import check_support, support_from_keys


class Prior:
    """A K x K relation prior E (``E[i, j] = P(i | j)``), validated.

    Args:
        matrix (array-like): the K x K matrix (a torch tensor too).
        classes (Sequence[str], optional): the names of its rows and
            columns, an ordered sequence (a list or tuple; a set is
            refused, its order changes from run to run); ``None``: an
            unnamed matrix.
        support (array-like, optional): (K,) the images each column was
            measured on (n >= 0), or one number for every column.
        marginals (array-like, optional): (K,) each class's share of those
            images (p in [0, 1]); given with ``support`` or not at all.
        meta (dict, optional): the file's other keys (``source``, ...),
            kept as they are when the prior is saved.
        name (str): how errors name the prior (a file, ``'model.prior'``,
            a checkpoint). Defaults to ``'prior'``.
        num_classes (int, optional): the expected K.
        reset_diagonal (bool): set the diagonal to 1 instead of requiring
            it.

    Raises:
        ValueError: one line naming ``name`` and the problem (shape, K,
            non-finite values, values outside [0, 1], the diagonal, class
            names, a support without its shares or with bad values).
    """

    __slots__ = ('matrix', 'classes', 'support', 'marginals', 'meta', 'name')

    def __init__(self,
                 matrix: Any,
                 classes: Optional[Sequence[str]] = None,
                 support: Any = None,
                 marginals: Any = None,
                 meta: Optional[Dict[str, Any]] = None,
                 name: str = 'prior',
                 num_classes: Optional[int] = None,
                 reset_diagonal: bool = False) -> None:
        try:
            arr = validate_prior(matrix, num_classes, reset_diagonal)
        except ValueError as exc:
            raise ValueError(f'{name}: {exc}') from None
        k = arr.shape[0]
        if classes is not None:
            try:
                classes = tuple(class_name_list(classes))
            except ValueError as exc:
                raise ValueError(f'{name}: {exc}') from None
            if len(classes) != k:
                raise ValueError(f'{name}: {len(classes)} class names for a '
                                 f'{k} x {k} matrix')
        support, marginals = check_support(support, marginals, k, name)
        arr.setflags(write=False)
        set_ = object.__setattr__
        set_(self, 'matrix', arr)
        set_(self, 'classes', classes)
        set_(self, 'support', support)
        set_(self, 'marginals', marginals)
        # a support's keys are written from the support itself
        set_(self, 'meta', {
            k: v
            for k, v in dict(meta or {}).items()
            if k not in ('images_per_class', 'support_images')
        })
        set_(self, 'name', str(name))

    def __setattr__(self, key, value):
        raise AttributeError('a Prior is immutable: make a new one')

    def __copy__(self) -> 'Prior':
        return self  # immutable: a copy is the same value

    def __deepcopy__(self, memo) -> 'Prior':
        return self

    def __reduce__(self):
        return (Prior, (np.array(self.matrix), self.classes, self.support,
                        self.marginals, self.meta, self.name))

    def __repr__(self) -> str:
        support = 'with a support' if self.has_support else 'no support'
        named = 'named' if self.classes else 'unnamed'
        return f'Prior({self.name!r}, K={self.num_classes}, {named}, ' \
            f'{support})'

    # ------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """K."""
        return self.matrix.shape[0]

    @property
    def has_support(self) -> bool:
        """Whether the prior records what it was measured on."""
        return self.support is not None

    def support_pair(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(support, marginals)``, (K,) float64 each, or ``None``."""
        return None if self.support is None else (self.support,
                                                  self.marginals)

    # ------------------------------------------------------------------
    @classmethod
    def load(cls,
             src: Any,
             classes: Optional[Sequence[str]] = None,
             num_classes: Optional[int] = None,
             name: Optional[str] = None,
             reset_diagonal: bool = False,
             shipped_names: bool = True) -> 'Prior':
        """Make a prior from what a config, a user or a file gives.

        Args:
            src (Prior | str | PathLike | dict | array-like | Tensor): a
                ``Prior``; a ``.json`` / ``.npy`` file or the name of a
                prior shipped in ``mmcalidet/data/priors`` (e.g.
                ``'coco2017_train'``); a dict in the prior file format; or a
                K x K matrix.
            classes (Sequence[str], optional): the order to return it in: a
                named prior is reordered by name (every name must match),
                an unnamed one is taken to be in this order.
            num_classes (int, optional): the expected K.
            name (str, optional): how errors name it (default: the file,
                else ``'prior'``).
            reset_diagonal (bool): set the diagonal to 1 instead of
                requiring it.
            shipped_names (bool): read a bare name that is no file as a
                shipped prior's. Defaults to True.

        Returns:
            Prior: the validated prior, in ``classes`` order when given.

        Raises:
            ValueError: one line naming the prior and the problem.
        """
        if isinstance(src, Prior):
            prior = src
        else:
            # the expected K bounds what is read (a huge file is not parsed)
            expected = num_classes if num_classes is not None else \
                None if classes is None else len(classes)
            prior = cls._from_source(src, expected, name, reset_diagonal,
                                     shipped_names)
        if classes is not None:
            prior = prior.reorder(classes)
        if num_classes is not None and prior.num_classes != num_classes:
            raise ValueError(f'{prior.name}: prior has K='
                             f'{prior.num_classes} classes, expected '
                             f'{num_classes}')
        return prior

    @classmethod
    def _from_source(cls, src, expected_k, name, reset_diagonal,
                     shipped_names) -> 'Prior':
        if isinstance(src, (str, os.PathLike)):
            path = resolve_shipped_name(src) if shipped_names \
                else os.fspath(src)
            where = name or path
            matrix, file_classes, meta = _read_prior_file(path, expected_k)
        elif isinstance(src, dict):
            where = name or 'prior'
            matrix, file_classes, meta = _split_prior_dict(src, where)
        else:
            where = name or 'prior'
            matrix, file_classes, meta = src, None, {}
        support = support_from_keys(meta, file_classes, where)
        if support is not None:  # written from the support from now on
            total_key = 'support_images' if 'support_images' in meta \
                else 'num_images'
            meta = {k: v for k, v in meta.items() if k != total_key}
        return cls(
            matrix,
            file_classes,
            *(support or (None, None)),
            meta=meta,
            name=where,
            reset_diagonal=reset_diagonal)

    # ------------------------------------------------------------------
    def reorder(self, classes: Sequence[str]) -> 'Prior':
        """This prior in the order of ``classes``.

        A named prior is reordered by name (exactly, else up to case and
        ``_`` vs space; every name must match); an unnamed one of the same
        K is taken to be in ``classes`` order and named by them.

        Raises:
            ValueError: naming the prior and the class that does not match.
        """
        classes = tuple(class_name_list(classes))
        if self.classes is None:
            if len(classes) != self.num_classes:
                raise ValueError(f'{self.name}: prior has K='
                                 f'{self.num_classes} classes, expected '
                                 f'{len(classes)}')
            return self._replace(classes=classes)
        if self.classes == classes:
            return self
        try:
            matrix = reorder_prior(self.matrix, list(self.classes),
                                   list(classes))
        except ValueError as exc:
            raise ValueError(f'{self.name}: {exc}') from None
        order = class_order(self.classes, classes)
        support = marginals = None
        if self.has_support:
            support, marginals = self.support[order], self.marginals[order]
        return Prior(
            matrix,
            classes,
            support,
            marginals,
            meta=self.meta,
            name=self.name)

    def with_support(self, support: Any, marginals: Any) -> 'Prior':
        """This matrix with another support (``None, None``: none)."""
        return self._replace(support=support, marginals=marginals)

    def without_support(self) -> 'Prior':
        """This matrix with no support (an edited or hand-made prior)."""
        return self._replace(support=None, marginals=None)

    def renamed(self, name: str) -> 'Prior':
        """The same prior, named ``name`` in errors."""
        return self._replace(name=name)

    def _replace(self, **changes) -> 'Prior':
        fields = dict(
            matrix=self.matrix,
            classes=self.classes,
            support=self.support,
            marginals=self.marginals,
            meta=self.meta,
            name=self.name)
        fields.update(changes)
        return Prior(**fields)

    # ------------------------------------------------------------------
    def file_keys(self) -> Dict[str, Any]:
        """The keys a prior file records besides ``classes`` and
        ``matrix``: the meta, then the support (``num_images`` and
        ``images_per_class``; ``support_images`` where the meta's
        ``num_images`` counts other images).

        Raises:
            ValueError: a support without class names to key its counts
                by, or a meta value that is not finite JSON (naming the
                key).
        """
        keys = dict(self.meta)
        if self.has_support:
            if self.classes is None:
                raise ValueError(f'{self.name}: a support is recorded by '
                                 'class name: the prior needs class names')
            n = self.support
            total = float(n[0]) if np.all(n == n[0]) else None
            if total is None:
                support_value = {
                    c: _number(v)
                    for c, v in zip(self.classes, n)
                }
            else:
                support_value = _number(total)
            if isinstance(support_value, dict) or \
                    keys.get('num_images', support_value) != support_value:
                keys['support_images'] = support_value
            else:
                keys['num_images'] = support_value
            keys['images_per_class'] = {
                c: _number(round(float(p) * float(m), 6))
                for c, p, m in zip(self.classes, self.marginals, n)
            }
        check_json_keys(keys, self.name)
        return keys

    def save(self, path, decimals: Optional[int] = None) -> str:
        """Write the prior file (atomically): the matrix, the class names,
        the support and the meta.

        Args:
            path (str | PathLike): ``.json``, or ``.npy`` (the matrix
                only: refused for a prior with a support, which it would
                drop).
            decimals (int, optional): round the stored values.

        Returns:
            str: the path written.
        """
        path = os.fspath(path)
        if path.endswith('.npy'):
            if self.has_support:
                raise ValueError(f'{path}: a .npy file holds the matrix '
                                 'only; write this prior, which has a '
                                 'support, as .json')
            return save_prior(path, self.matrix)
        if self.classes is None:
            raise ValueError('save: class names are required for a JSON '
                             'prior file')
        return save_prior(
            path,
            self.matrix,
            list(self.classes),
            decimals=decimals,
            **self.file_keys())

    def to_dict(self) -> Dict[str, Any]:
        """The prior in the file format (a dict :meth:`load` takes)."""
        out = dict(self.file_keys())
        if self.classes is not None:
            out['classes'] = list(self.classes)
        out['matrix'] = self.matrix.tolist()
        return out


# ----------------------------------------------------------------------
def class_order(file_classes: Sequence[str],
                classes: Sequence[str]) -> np.ndarray:
    """The index in ``file_classes`` of each of ``classes`` (matched as
    :func:`reorder_prior` matches them)."""
    index = {n: k for k, n in enumerate(file_classes)}
    loose = {_loose_name(n): k for k, n in enumerate(file_classes)}
    return np.array(
        [index.get(c, loose.get(_loose_name(c))) for c in classes],
        dtype=np.int64)


def _number(value: float):
    """An int where the float is one (counts read as they were written)."""
    value = float(value)
    return int(value) if value.is_integer() else value
