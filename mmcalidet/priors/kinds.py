# Copyright (c) mmcalidet contributors. All rights reserved.
"""Prior kinds: the priors an evaluation builds from its images' labels and
E_t, one registry entry each.

A kind has a name (the key tables and tools use: ``E_t``, ``flip_E_x``),
a builder, the label tables print, a one-line note and an oracle flag (it
reads the evaluation images' ground truth). The builder takes the
:class:`KindInputs` of an evaluation set and gives a K x K matrix (the same
prior for every image) or a per-image callable ``fn(indices) -> N x K x
K`` (one matrix per cached image index), the two forms
:class:`~mmcalidet.evaluation.Rescorer` takes.

The paper's kinds, from the most misleading to the most accurate:
``flip_E_x``, ``E0``, ``E_t``, ``E_v``, ``E_b``, ``E_x``; and the content
kinds ``filled_E_x`` / ``filled_flip_E_x`` (E_x and flip(E_x) with the
columns of the classes an image does not show from E_t: no presence
pattern left). A new kind is one decorated builder::

    @register_prior_kind('E_mid', note='halfway between E0 and E_t')
    def halfway_prior(inputs: KindInputs) -> np.ndarray:
        return (flat_prior(inputs.num_classes) + inputs.train_prior) / 2

``--priors E_mid`` of the evaluation tools then finds it (the module that
registers it imported first).
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from .prior_source import load_prior
from .statistics import batch_prior, flat_prior, flip_prior, sample_prior

#: what a builder gives: one matrix, or a matrix per cached image index
KindPrior = Union[np.ndarray, Callable[[np.ndarray], np.ndarray]]


class KindInputs:
    """What a kind's builder reads: an evaluation set's labels and E_t.

    Args:
        label_lists (Sequence[np.ndarray]): ground-truth class indices of
            each image, in cache order.
        train_prior (np.ndarray): E_t, K x K.
        batch_ids (Sequence[int], optional): the evaluation batch of each
            image (E_b's groups; default all in one batch, i.e. E_v).
    """

    def __init__(self,
                 label_lists: Sequence[np.ndarray],
                 train_prior: np.ndarray,
                 batch_ids: Optional[Sequence[int]] = None) -> None:
        self.label_lists = label_lists
        self.train_prior = train_prior
        self.num_classes = train_prior.shape[0]
        self.batch_ids = batch_ids if batch_ids is not None else \
            [0] * len(label_lists)
        self._per_image: Optional[List[np.ndarray]] = None

    @property
    def per_image(self) -> List[np.ndarray]:
        """E_x of each image (computed once, for every kind that reads
        it)."""
        if self._per_image is None:
            self._per_image = [
                sample_prior(self.num_classes, labels)
                for labels in self.label_lists
            ]
        return self._per_image


@dataclass(frozen=True)
class PriorKind:
    """A registered prior kind.

    Attributes:
        name (str): its key.
        builder (callable): ``builder(inputs: KindInputs) -> KindPrior``.
        label (str): how tables print it.
        note (str): one-line description.
        oracle (bool): computed from the evaluation set's ground truth.
    """
    name: str
    builder: Callable[[KindInputs], KindPrior]
    label: str
    note: str
    oracle: bool

    def build(self, inputs: KindInputs) -> KindPrior:
        """The kind's prior for an evaluation set.

        Args:
            inputs (KindInputs): the set's labels and E_t.

        Returns:
            np.ndarray | callable: a K x K matrix or a per-image callable.
        """
        return self.builder(inputs)


#: name -> kind, in registration order
PRIOR_KINDS: Dict[str, PriorKind] = {}


def register_prior_kind(name: str,
                        label: Optional[str] = None,
                        note: str = '',
                        oracle: bool = False) -> Callable:
    """A decorator registering a builder as the prior kind ``name``.

    Args:
        name (str): the kind's key (unique).
        label (str, optional): how tables print it (default ``name``).
        note (str): one-line description.
        oracle (bool): whether it reads the evaluation set's ground truth.

    Returns:
        callable: the decorator (it gives the builder back unchanged).

    Raises:
        ValueError: ``name`` is empty, not a string, or taken.
    """
    if not isinstance(name, str) or not name or '=' in name:
        raise ValueError(f'a prior kind needs a name without "=", got '
                         f'{name!r}')
    if name in PRIOR_KINDS:
        raise ValueError(f'the prior kind {name!r} is registered already')

    def register(builder: Callable[[KindInputs], KindPrior]) -> Callable:
        PRIOR_KINDS[name] = PriorKind(name, builder, label or name, note,
                                      bool(oracle))
        return builder

    return register


def get_prior_kind(name: str) -> PriorKind:
    """The registered kind ``name``.

    Args:
        name (str): its key.

    Returns:
        PriorKind: the kind.

    Raises:
        KeyError: no kind of that name (the known names are listed).
    """
    if name not in PRIOR_KINDS:
        raise KeyError(f'unknown prior kind {name!r}; choose from '
                       f'{list(PRIOR_KINDS)}')
    return PRIOR_KINDS[name]


def prior_label(name: str) -> str:
    """How tables print a prior: a kind's label, any other name as it is
    (a user prior's label, say)."""
    kind = PRIOR_KINDS.get(name)
    return name if kind is None else kind.label


def priors_by_cache_index(matrices: Sequence[np.ndarray]) -> Callable:
    """A per-image prior callable from one matrix per cached image:
    ``fn(indices)`` stacks the matrices of those cache indices (the form of
    the E_x and E_b oracle priors and their variants). Not
    :func:`mmcalidet.apis.per_image_priors`, which splits a call's
    ``prior`` argument into one prior per image.

    Args:
        matrices (Sequence[np.ndarray]): a K x K matrix per cached image.

    Returns:
        callable: ``fn(indices) -> N x K x K``.
    """

    def fn(indices: np.ndarray) -> np.ndarray:
        return np.stack([matrices[k] for k in indices])

    return fn


def group_priors(label_lists: Sequence[np.ndarray], groups: Sequence[int],
                 num_classes: int) -> Callable:
    """A per-image callable giving each image E_b of its group.

    Args:
        label_lists (Sequence[np.ndarray]): class indices per image.
        groups (Sequence[int]): the group of each image.
        num_classes (int): K.

    Returns:
        callable: ``fn(indices) -> N x K x K``.
    """
    groups = np.asarray(groups)
    table = {
        g:
        batch_prior(num_classes,
                    [label_lists[k] for k in np.flatnonzero(groups == g)])
        for g in np.unique(groups)
    }
    return priors_by_cache_index([table[g] for g in groups])


def fill_absent_columns(prior: np.ndarray, labels: Sequence[int],
                        train_prior: np.ndarray) -> np.ndarray:
    """A per-image prior with the columns of the classes the image does
    not show taken from E_t: what is left of E_x is its content (which
    classes go with the present ones), not the presence pattern.

    Args:
        prior (np.ndarray): the image's K x K prior (E_x or flip(E_x)).
        labels (Sequence[int]): its classes.
        train_prior (np.ndarray): E_t.

    Returns:
        np.ndarray: K x K float64.
    """
    present = np.zeros(len(prior), dtype=bool)
    present[np.asarray(labels, dtype=np.int64)] = True
    filled = np.array(train_prior, dtype=np.float64, copy=True)
    filled[:, present] = prior[:, present]
    np.fill_diagonal(filled, 1.0)
    return filled


@register_prior_kind(
    'flip_E_x',
    label='flip(E_x)',
    note='E_x of each image with 0 and 1 swapped (misleading)',
    oracle=True)
def flipped_image_priors(inputs: KindInputs) -> Callable:
    """flip(E_x) of each image."""
    return priors_by_cache_index([flip_prior(p) for p in inputs.per_image])


@register_prior_kind('E0', note='flat prior (nothing known)')
def flat_kind(inputs: KindInputs) -> np.ndarray:
    """E0: 0.5 off the diagonal."""
    return flat_prior(inputs.num_classes)


@register_prior_kind(
    'E_t', note='training statistics (the default deployment prior)')
def train_kind(inputs: KindInputs) -> np.ndarray:
    """E_t, validated."""
    return load_prior(inputs.train_prior, num_classes=inputs.num_classes)


@register_prior_kind(
    'E_v', note='statistics of the whole evaluation set', oracle=True)
def evaluation_set_prior(inputs: KindInputs) -> np.ndarray:
    """E_v: the statistics of every image."""
    return batch_prior(inputs.num_classes, inputs.label_lists)


@register_prior_kind(
    'E_b', note='statistics of each evaluation batch', oracle=True)
def batch_kind(inputs: KindInputs) -> Callable:
    """E_b: each image gets the statistics of its batch."""
    return group_priors(inputs.label_lists, inputs.batch_ids,
                        inputs.num_classes)


@register_prior_kind(
    'E_x', note='statistics of each image (upper bound)', oracle=True)
def image_priors(inputs: KindInputs) -> Callable:
    """E_x: each image's own statistics."""
    return priors_by_cache_index(inputs.per_image)


def _filled(inputs: KindInputs, flip: bool) -> Callable:
    return priors_by_cache_index([
        fill_absent_columns(
            flip_prior(p) if flip else p, labels, inputs.train_prior)
        for p, labels in zip(inputs.per_image, inputs.label_lists)
    ])


@register_prior_kind(
    'filled_flip_E_x',
    label='filled flip(E_x)',
    note='flip(E_x), the columns of absent classes from E_t',
    oracle=True)
def filled_flipped_image_priors(inputs: KindInputs) -> Callable:
    """flip(E_x) with the absent classes' columns from E_t."""
    return _filled(inputs, flip=True)


@register_prior_kind(
    'filled_E_x',
    label='filled E_x',
    note='E_x, the columns of absent classes from E_t',
    oracle=True)
def filled_image_priors(inputs: KindInputs) -> Callable:
    """E_x with the absent classes' columns from E_t."""
    return _filled(inputs, flip=False)
