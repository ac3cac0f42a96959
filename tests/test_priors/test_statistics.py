# Copyright (c) mmcalidet contributors. All rights reserved.
"""Relation statistics against the paper's reference code."""
import itertools as it
from typing import List

import numpy as np
import pytest

from mmcalidet.priors import (batch_prior, cooccurrence_counts,
                              counts_to_prior, flat_prior, flip_prior,
                              label_lists_prior, prior_from_flat, prior_mae,
                              sample_prior)
from mmcalidet.priors._cooccurrence import cooccurrence_lists
from mmcalidet.priors.statistics import counts_from_flat


# --- the paper's reference code (supplementary, "Calculation of Matrix E")
def edge_flat_prior(num_cls: int) -> np.ndarray:
    E = np.ones((num_cls, num_cls)) * 0.5
    np.fill_diagonal(E, 1.0)
    return E


def edge_sample(num_cls: int, labels: List[int]) -> np.ndarray:
    E = np.ones((num_cls, num_cls)) * 0.5
    for j in labels:
        E[:, j] = 0.0
        E[labels, j] = 1.0
    np.fill_diagonal(E, 1.0)
    return E


def sparse2dense(num_cls, targets):
    dense = np.zeros((num_cls, len(targets)))
    for (j, labels) in enumerate(targets):
        dense[labels, j] = 1.0
    return dense


def dense2edge(dense):
    num_cls, batch_size = dense.shape
    E = np.ones((num_cls, num_cls)) * 0.5
    rN = range(num_cls)
    for (i, j) in it.product(rN, rN):
        cij = np.logical_and(dense[i, :], dense[j, :]).sum()
        cj = dense[j, :].sum()
        if cj > 0:
            pij = cij / cj
        else:
            pij = 0.5  # flat prior
        E[i, j] = pij
    np.fill_diagonal(E, 1.0)
    return E


def edge_batch(num_cls, targets):
    return dense2edge(sparse2dense(num_cls, targets))
# ---


def test_flat_prior_matches_reference():
    for k in (1, 2, 5, 80):
        np.testing.assert_array_equal(flat_prior(k), edge_flat_prior(k))


def test_paper_example():
    batch = [[0, 2], [1, 2], [0, 1, 2]]
    expected = np.array([[1, .5, 2 / 3], [.5, 1, 2 / 3], [1, 1, 1]])
    np.testing.assert_allclose(batch_prior(3, batch), expected)
    for labels in batch:
        np.testing.assert_array_equal(
            sample_prior(3, labels), edge_sample(3, labels))


@pytest.mark.parametrize('seed', range(5))
def test_batch_prior_equals_reference_on_random_sets(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        k = int(rng.integers(1, 12))
        n = int(rng.integers(0, 12))
        # duplicates within a list and empty images are drawn on purpose
        targets = [
            list(rng.integers(0, k, int(rng.integers(0, 7))))
            for _ in range(n)
        ]
        np.testing.assert_array_equal(
            batch_prior(k, targets), edge_batch(k, targets))
        for labels in targets:
            np.testing.assert_array_equal(
                sample_prior(k, labels), edge_sample(k, labels))


def test_duplicates_empty_images_and_absent_classes():
    e = batch_prior(4, [[1, 1, 1], [], [1, 2, 2]])
    ref = edge_batch(4, [[1, 1, 1], [], [1, 2, 2]])
    np.testing.assert_array_equal(e, ref)
    # class 0 and 3 never occur: flat columns, diagonal 1
    np.testing.assert_array_equal(e[:, 0], [1, .5, .5, .5])
    np.testing.assert_array_equal(e[:, 3], [.5, .5, .5, 1])
    # duplicates count once: P(2 | 1) = 1/2
    assert e[2, 1] == 0.5
    # no images at all gives E0
    np.testing.assert_array_equal(batch_prior(4, []), flat_prior(4))
    np.testing.assert_array_equal(sample_prior(4, []), flat_prior(4))


def test_k_equals_one():
    np.testing.assert_array_equal(batch_prior(1, [[0], [], [0, 0]]),
                                  np.ones((1, 1)))


def test_counts_and_flat_interface_agree():
    targets = [[0, 2], [1, 2], [0, 1, 2], [], [2, 2]]
    cooc, n = cooccurrence_counts(targets, 3)
    np.testing.assert_array_equal(n, [2, 2, 4])
    np.testing.assert_array_equal(np.diag(cooc), n)
    assert cooc[0, 2] == 2 and cooc[2, 0] == 2
    flat = np.array([0, 2, 1, 2, 0, 1, 2, 2, 2])
    offsets = np.array([0, 2, 4, 7, 7, 9])
    np.testing.assert_array_equal(
        prior_from_flat(flat, offsets, 3), batch_prior(3, targets))


def test_numpy_inputs_accepted():
    e = batch_prior(5, [np.array([0, 4], dtype=np.int32), (3, ), [4.0]])
    np.testing.assert_array_equal(
        e, edge_batch(5, [[0, 4], [3], [4]]))


@pytest.mark.parametrize('labels, message', [
    ([[0, 5]], 'out of range'),
    ([[-1]], 'negative'),
    ([[0.5]], 'integers'),
    ([['a']], 'integers'),
    ([[True]], 'integers'),
])
def test_bad_labels(labels, message):
    with pytest.raises(ValueError, match=message):
        batch_prior(5, labels)


def test_bad_labels_name_the_image():
    with pytest.raises(ValueError, match=r'label_lists\[2\]'):
        batch_prior(3, [[0], [1], [7]])


@pytest.mark.parametrize('k', [0, -2, 2.5, '3'])
def test_bad_num_classes(k):
    with pytest.raises(ValueError, match='num_classes'):
        flat_prior(k)


def test_bad_offsets():
    with pytest.raises(ValueError, match='offsets'):
        prior_from_flat(np.array([0, 1]), np.array([0, 3]), 2)


def test_flip_prior():
    ex = sample_prior(4, [0, 2])
    flipped = flip_prior(ex)
    off = ~np.eye(4, dtype=bool)
    # 0 <-> 1 where E_x is 0 or 1, 0.5 stays, diagonal stays 1
    np.testing.assert_array_equal(flipped[off & (ex == 1)], 0)
    np.testing.assert_array_equal(flipped[off & (ex == 0)], 1)
    np.testing.assert_array_equal(flipped[ex == 0.5], 0.5)
    np.testing.assert_array_equal(np.diag(flipped), 1)
    with pytest.raises(ValueError, match=r'\[0, 1\]'):
        flip_prior(np.array([[1, 2], [0, 1]]))


def test_label_lists_prior_modes():
    lists = [[0], [1, 2], [2], [0, 1]]
    per_image = label_lists_prior(lists, 3)
    for k, labels in enumerate(lists):
        np.testing.assert_array_equal(per_image[k], sample_prior(3, labels))
    grouped = label_lists_prior(lists, 3, groups=[0, 0, 1, 1])
    np.testing.assert_array_equal(grouped[0], batch_prior(3, lists[:2]))
    np.testing.assert_array_equal(grouped[1], grouped[0])
    np.testing.assert_array_equal(grouped[3], batch_prior(3, lists[2:]))


def test_prior_mae():
    a, b = flat_prior(3), batch_prior(3, [[0, 1]])
    assert prior_mae(a, a) == 0
    assert prior_mae(a, b) == pytest.approx(np.abs(a - b).mean())
    assert prior_mae(a, b, exclude_diagonal=True) == pytest.approx(
        np.abs(a - b)[~np.eye(3, dtype=bool)].mean())


@pytest.mark.parametrize('k', [64, 65, 128, 129, 200])
def test_large_k_paths_equal_reference(k):
    """K <= 128 counts with bit masks, larger K with a seen-array: both
    must equal the reference, around the word and path boundaries."""
    rng = np.random.default_rng(k)
    targets = [
        list(rng.integers(0, k, int(rng.integers(0, 9)))) + [k - 1] * (i % 2)
        for i in range(30)
    ]
    np.testing.assert_array_equal(
        batch_prior(k, targets), edge_batch(k, targets))


@pytest.mark.parametrize('k', [1, 3, 64, 65, 128, 129, 300])
def test_python_list_fast_path_equals_the_flat_core(k):
    """Label lists are counted in one pass over the Python objects (lists,
    tuples, int64 arrays; ints above 256 are not CPython's cached ones):
    the same counts as the flat-array core."""
    rng = np.random.default_rng(k)
    arrays = [rng.integers(0, k, int(rng.integers(0, 9))) for _ in range(300)]
    offsets = np.cumsum([0] + [a.size for a in arrays])
    expected = counts_from_flat(np.concatenate(arrays), offsets, k)
    lists = [a.tolist() for a in arrays]
    kinds = dict(
        lists=lists,
        tuples=tuple(tuple(x) for x in lists),
        arrays=arrays,
        strided=[np.repeat(a, 2)[::2] for a in arrays],
        read_only=[
            np.frombuffer(a.tobytes(), dtype=np.int64) for a in arrays
        ],
        mixed=[a if i % 3 else lists[i] for i, a in enumerate(arrays)])
    for name, label_lists in kinds.items():
        counts = cooccurrence_lists(label_lists, k)
        assert counts is not None, name
        for got, want in zip(counts, expected):
            np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(
            batch_prior(k, label_lists), counts_to_prior(*expected))


@pytest.mark.parametrize('label_lists', [
    [[0], [np.int64(1)]],
    [[0], [True]],
    [[1.0]],
    [[0], [5]],
    [[-1]],
    [[2**31]],
    [[-2**40]],
    [np.array([1], dtype=np.int32)],
    [np.array([1], dtype='>i8')],
    [np.zeros((1, 1), dtype=np.int64)],
    [[[0, 1]]],
    [{0, 1}],
])
def test_python_list_fast_path_leaves_the_rest_to_the_general_path(
        label_lists):
    assert cooccurrence_lists(label_lists, 5) is None
    assert cooccurrence_lists(iter(label_lists), 5) is None


def test_general_path_inputs_give_the_same_priors():
    # big-endian and 2-D arrays, numpy scalars, generators: the general path
    e = batch_prior(5, [
        np.array([0, 4], dtype='>i8'),
        np.array([[3]], dtype=np.int64), [np.int64(4)]
    ])
    np.testing.assert_array_equal(e, edge_batch(5, [[0, 4], [3], [4]]))
    np.testing.assert_array_equal(
        batch_prior(5, (x for x in [[0, 4], [3]])),
        edge_batch(5, [[0, 4], [3]]))
    with pytest.raises(ValueError, match=r'label_lists\[1\].*out of range'):
        batch_prior(5, [[0], [2**31]])
