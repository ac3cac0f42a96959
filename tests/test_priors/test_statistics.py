# Copyright (c) mmcalidet contributors. All rights reserved.
"""Relation statistics against the paper's reference code and a brute-force
oracle."""
import itertools as it
import os.path as osp
import re
from typing import List, Sequence, Tuple

import numpy as np
import pytest

import mmcalidet.priors
from mmcalidet.priors import (batch_prior, cooccurrence_counts,
                              counts_to_prior, flat_prior, flip_prior,
                              label_lists_prior, prior_from_flat, prior_mae,
                              sample_prior)
from mmcalidet.priors._cooccurrence import cooccurrence_lists
from mmcalidet.priors.statistics import counts_from_flat
from mmcalidet.priors.yolo_tarball import read_yolo_tarball


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


# --- an independent oracle: the definition, one image and one pair at a time
def oracle_counts(num_classes: int,
                  label_lists: Sequence) -> Tuple[list, list]:
    """Brute force over images and pairs of present classes, in plain
    Python: ``n[j]`` images hold ``j``, ``both[i][j]`` hold ``i`` and
    ``j`` (a class listed twice in an image is present once)."""
    n = [0] * num_classes
    both = [[0] * num_classes for _ in range(num_classes)]
    for labels in label_lists:
        present = set()
        for x in np.ravel(labels).tolist():  # a 2-D array: its labels
            assert int(x) == x and 0 <= x < num_classes, x
            present.add(int(x))
        for j in present:
            n[j] += 1
            for i in present:
                both[i][j] += 1
    return both, n


def oracle_prior(num_classes: int, label_lists: Sequence) -> np.ndarray:
    """E[i, j] = P(i present | j present); 0.5 where j never occurs;
    diagonal 1."""
    both, n = oracle_counts(num_classes, label_lists)
    prior = np.empty((num_classes, num_classes))
    for i in range(num_classes):
        for j in range(num_classes):
            if i == j:
                prior[i, j] = 1.0
            elif n[j] == 0:
                prior[i, j] = 0.5
            else:
                prior[i, j] = both[i][j] / n[j]
    return prior


def assert_equals_oracle(num_classes: int,
                         label_lists: Sequence,
                         fast_path: bool = True) -> None:
    """The Cython results, on every entry point, equal the oracle exactly:
    the one-pass reader of Python lists (``fast_path``: it must take these
    inputs), the flat-array core and the public ``batch_prior``."""
    both, n = oracle_counts(num_classes, label_lists)
    want_c = np.array(both, dtype=np.int64).reshape(num_classes, num_classes)
    want_n = np.array(n, dtype=np.int64)
    want_e = oracle_prior(num_classes, label_lists)
    if fast_path:
        for outer in (list(label_lists), tuple(label_lists)):
            counts = cooccurrence_lists(outer, num_classes)
            assert counts is not None
            np.testing.assert_array_equal(counts[0], want_c)
            np.testing.assert_array_equal(counts[1], want_n)
    arrays = [np.asarray(x, dtype=np.int64).reshape(-1) for x in label_lists]
    offsets = np.cumsum([0] + [a.size for a in arrays])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    got_c, got_n = counts_from_flat(flat, offsets, num_classes)
    np.testing.assert_array_equal(got_c, want_c)
    np.testing.assert_array_equal(got_n, want_n)
    np.testing.assert_array_equal(
        prior_from_flat(flat, offsets, num_classes), want_e)
    got_c, got_n = cooccurrence_counts(label_lists, num_classes)
    np.testing.assert_array_equal(got_c, want_c)
    np.testing.assert_array_equal(got_n, want_n)
    np.testing.assert_array_equal(
        batch_prior(num_classes, label_lists), want_e)
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


class SubInt(int):
    """An ``int`` subclass: not an exact int, left to the general path."""


def as_kind(label_lists: list, kind: str) -> list:
    """The same label lists as lists, tuples, int64 arrays or a mix."""
    if kind == 'lists':
        return label_lists
    if kind == 'tuples':
        return [tuple(x) for x in label_lists]
    arrays = [np.asarray(x, dtype=np.int64) for x in label_lists]
    if kind == 'arrays':
        return arrays
    # lists, tuples, arrays and reversed (negative-stride) arrays in turn
    kinds = (label_lists, [tuple(x) for x in label_lists], arrays,
             [a[::-1] for a in arrays])
    return [kinds[i % 4][i] for i in range(len(label_lists))]


@pytest.mark.parametrize('kind', ['lists', 'tuples', 'arrays', 'mixed'])
@pytest.mark.parametrize('k', [1, 2, 5, 63, 64, 65, 80, 127, 128, 129, 300])
def test_cython_equals_oracle_on_random_sets(k, kind):
    """Around the bit-mask words (64, 128) and the seen-array path; ints
    above 256 are not shared objects in CPython."""
    rng = np.random.default_rng(k)
    label_lists = [
        rng.integers(0, k, int(rng.integers(0, 12))).tolist()
        for _ in range(150)
    ]
    label_lists += [[k - 1] * 3, [], [0, k - 1, 0]]  # duplicates, empty
    assert_equals_oracle(k, as_kind(label_lists, kind))


def test_cython_equals_oracle_beyond_the_identity_table():
    """More classes than the int objects the list reader keeps by identity
    (1024): the larger labels go through ``PyLong_AsLongLongAndOverflow``."""
    k = 1100
    rng = np.random.default_rng(0)
    label_lists = [
        rng.integers(0, k, int(rng.integers(0, 9))).tolist()
        for _ in range(100)
    ] + [[1099, 1099, 3], [1023, 1024]]
    assert_equals_oracle(k, label_lists)


@pytest.mark.parametrize('k, label_lists', [
    (3, []),
    (3, [[]]),
    (3, [[], [], []]),
    (4, [[2, 2, 2]]),
    (4, [[1, 1, 2, 2, 1], [2], [2, 2], []]),
    (5, [[0, 1], [1, 3], [0, 3, 3]]),
    (1, [[0], [], [0, 0]]),
    (130, [[129, 129, 0], [64, 63, 129], [], [127, 128]]),
])
def test_cython_equals_oracle_on_edge_cases(k, label_lists):
    """No image, empty images, duplicates, classes never present."""
    assert_equals_oracle(k, label_lists)
    e = batch_prior(k, label_lists)
    np.testing.assert_array_equal(np.diag(e), 1)
    present = {x for labels in label_lists for x in labels}
    for j in set(range(k)) - present:
        np.testing.assert_array_equal(np.delete(e[:, j], j), 0.5)


def test_duplicates_count_once_against_the_oracle():
    label_lists = [[1, 1, 2, 2, 1], [2], [2, 2], []]
    both, n = oracle_counts(4, label_lists)
    assert n == [0, 1, 3, 0] and both[1][2] == both[2][1] == 1
    e = batch_prior(4, label_lists)
    assert e[2, 1] == 1.0 and e[1, 2] == 1 / 3


@pytest.mark.parametrize('label_lists', [
    [[SubInt(1), 2], [0]],
    [[np.int64(1)], [2, 0]],
    [np.array([0, 2], dtype=np.int32), [1]],
    [[4.0, 0]],
    [np.array([[3, 1]], dtype=np.int64)],
    [np.array([0, 4], dtype='>i8')],
])
def test_general_path_equals_oracle(label_lists):
    """Inputs the one-pass reader leaves to the general conversion give the
    oracle's results too."""
    assert cooccurrence_lists(label_lists, 5) is None
    assert_equals_oracle(5, label_lists, fast_path=False)


@pytest.mark.parametrize('bad, message', [
    (-1, 'class index -1 is negative'),
    (-2**40, f'class index {-2**40} is negative'),
    (5, 'class index 5 is out of range for num_classes=5'),
    (2**31, f'class index {2**31} is out of range for num_classes=5'),
    (0.5, r'class indices must be integers, got \S*0\.5'),
    (float('nan'), r'class indices must be integers, got \S*nan'),
    ('a', 'class indices must be integers'),
    (None, 'class indices must be integers'),
    (True, 'class indices must be integers'),
    (np.True_, 'class indices must be integers'),
    (2**70, 'class indices must be integers'),
])
@pytest.mark.parametrize('container', [list, tuple])
def test_bad_labels_give_clear_errors(bad, message, container):
    """A bad label among good ones: the one-pass reader hands over, and the
    general path names the image and the label."""
    label_lists = [[0, 1], [], container([2, bad])]
    assert cooccurrence_lists(label_lists, 5) is None
    with pytest.raises(ValueError, match=r'label_lists\[2\]: ' + message):
        batch_prior(5, label_lists)
    with pytest.raises(ValueError, match=r'label_lists\[2\]: ' + message):
        cooccurrence_counts(container(label_lists), 5)


@pytest.mark.parametrize('bad, message', [
    (-1, 'class index -1 is negative'),
    (3, 'class index 3 is out of range for num_classes=3'),
])
def test_bad_labels_in_the_flat_core(bad, message):
    with pytest.raises(ValueError, match=message):
        counts_from_flat(np.array([0, 1, bad]), np.array([0, 2, 3]), 3)


@pytest.mark.parametrize('split', ['val2017', 'train2017'])
def test_cython_equals_oracle_on_coco(datasets_dir, split):
    """All of COCO's label sets (train2017: 117,266 images), as the lists
    the benchmark times."""
    sets = read_yolo_tarball(
        osp.join(datasets_dir, 'coco2017-labels', f'labels_{split}.tar.gz'))
    label_lists = [a.tolist() for a in sets.label_lists()]
    assert_equals_oracle(80, label_lists)


#: names that reach into CPython's object layout or private API: struct
#: fields (``ob_digit``, ``ob_size``, ...), int internals, ``_Py*`` and
#: ``PyUnstable_*`` functions, addresses from ``id()``
PRIVATE_LAYOUT = re.compile(r'\bob_\w+|\blv_tag\b|\blong_value\b|\bPy_SIZE\b'
                            r'|\bPyLongObject\b|\bPyUnstable_\w+|\b_Py\w+'
                            r'|\bid\(')


def test_cython_source_uses_no_private_object_layout():
    path = osp.join(
        osp.dirname(mmcalidet.priors.__file__), '_cooccurrence.pyx')
    with open(path, encoding='utf-8') as f:
        source = f.read()
    found = sorted(set(PRIVATE_LAYOUT.findall(source)))
    assert not found, f'{path} reads private CPython layout: {found}'
    # the pattern does catch what the earlier version used
    assert PRIVATE_LAYOUT.findall(
        '((PyLongObject*)o)->ob_digit[0]; Py_SIZE(o); id(i); '
        '_PyLong_IsCompact(o); PyUnstable_Long_CompactValue(o)') == [
            'PyLongObject', 'ob_digit', 'Py_SIZE', 'id(', '_PyLong_IsCompact',
            'PyUnstable_Long_CompactValue'
        ]
