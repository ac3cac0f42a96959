# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior value (:class:`mmcalidet.priors.Prior`): validated once where
it is made, its support carried whole or refused by key, never dropped."""
import json

import numpy as np
import pytest

from mmcalidet.priors import Prior, load_prior, save_prior
from mmcalidet.priors.edit import edit_prior
from testing import random_prior

CLASSES = ['person', 'bicycle', 'car', 'dog']
K = len(CLASSES)


def prior_dict(**keys):
    """A prior in the file format, with extra keys."""
    return dict(classes=CLASSES, matrix=random_prior(0, K).tolist(), **keys)


def counts(*values):
    return dict(zip(CLASSES, values))


def test_a_file_support_is_read_in_its_class_order_and_reordered():
    prior = Prior.load(
        prior_dict(num_images=10, images_per_class=counts(10, 2, 5, 0)))
    assert prior.has_support
    np.testing.assert_array_equal(prior.support, np.full(K, 10.0))
    np.testing.assert_allclose(prior.marginals, [1.0, 0.2, 0.5, 0.0])
    order = CLASSES[::-1]
    flipped = prior.reorder(order)
    assert flipped.classes == tuple(order)
    np.testing.assert_allclose(flipped.marginals, [0.0, 0.5, 0.2, 1.0])
    np.testing.assert_array_equal(flipped.matrix,
                                  prior.matrix[::-1, ::-1])


def test_support_images_is_the_support_where_the_file_has_it():
    """A fitted prior's num_images counts the site images it was fitted on;
    support_images is what the matrix was scored with."""
    prior = Prior.load(
        prior_dict(
            num_images=32,
            support_images=1000,
            images_per_class=counts(500, 10, 0, 1000)))
    np.testing.assert_array_equal(prior.support, np.full(K, 1000.0))
    assert prior.meta['num_images'] == 32
    keys = prior.file_keys()
    assert keys['num_images'] == 32 and keys['support_images'] == 1000


@pytest.mark.parametrize('keys, match', [
    (dict(num_images=10, images_per_class=[1, 2, 3, 4]),
     'images_per_class must map each class name'),
    (dict(num_images=10, images_per_class=None),
     'images_per_class must map each class name'),
    (dict(images_per_class=counts(1, 2, 3, 4)),
     'images_per_class needs num_images'),
    (dict(num_images=float('nan'), images_per_class=counts(1, 2, 3, 4)),
     'num_images must be a positive number'),
    (dict(num_images=3, images_per_class=counts(1, 2, 3, 4)),
     r"images_per_class\['dog'\] exceeds num_images"),
    (dict(num_images=10, images_per_class=dict(person=1)),
     "no count for 'bicycle'"),
    (dict(num_images=10, images_per_class=counts(1, 2, 'x', 4)),
     'must be numbers'),
    (dict(num_images=10, images_per_class=counts(1, 2, -3, 4)),
     'finite counts >= 0'),
    (dict(num_images=10, support_images=0,
          images_per_class=counts(0, 0, 0, 0)),
     'support_images must be a positive number'),
    (dict(support_images=10), 'support_images without images_per_class'),
])
def test_a_partial_or_bad_support_is_refused_by_key(keys, match):
    """Each case was silently dropped or clipped before: the prior read
    as if it recorded no support, or with counts clipped to [0, 1]."""
    with pytest.raises(ValueError, match=match):
        Prior.load(prior_dict(**keys))


def test_a_file_without_images_per_class_records_no_support():
    prior = Prior.load(prior_dict(num_images=10, source='hand-made'))
    assert not prior.has_support
    assert prior.meta == dict(num_images=10, source='hand-made')


def test_an_unnamed_matrix_cannot_record_a_support_by_name():
    with pytest.raises(ValueError, match='no class names'):
        Prior.load(
            dict(
                matrix=random_prior(0, K).tolist(),
                num_images=4,
                images_per_class={'a': 1}))


@pytest.mark.parametrize('support, marginals, match', [
    (None, np.zeros(K), 'marginals without a support'),
    (np.ones(K), None, 'a support without marginals'),
    ('abc', np.zeros(K), 'the support must be numbers'),
    (np.ones(K - 1), np.zeros(K), r'the support must have shape \(4,\)'),
    (np.ones(K), np.full(K, 7.0), 'must lie in \\[0, 1\\], got 7'),
    (-np.ones(K), np.zeros(K), 'the support must be >= 0'),
    (np.ones(K), np.full(K, np.nan), 'the marginals must be finite'),
])
def test_a_support_is_given_whole_and_valid(support, marginals, match):
    with pytest.raises(ValueError, match=match):
        Prior(random_prior(0, K), support=support, marginals=marginals)


def test_a_prior_is_immutable():
    prior = Prior(random_prior(0, K), CLASSES)
    with pytest.raises(AttributeError):
        prior.matrix = np.eye(K)
    with pytest.raises(ValueError):
        prior.matrix[0, 1] = 0.3  # read-only array


def test_the_file_round_trip_keeps_matrix_classes_and_support(tmp_path):
    prior = Prior(
        random_prior(1, K),
        CLASSES,
        support=np.full(K, 20.0),
        marginals=[0.5, 0.05, 0.0, 1.0],
        meta=dict(source='site A'))
    path = prior.save(tmp_path / 'site.json')
    data = json.load(open(path))
    assert data['num_images'] == 20
    assert data['images_per_class'] == counts(10, 1, 0, 20)
    back = Prior.load(path)
    np.testing.assert_array_equal(back.matrix, prior.matrix)
    np.testing.assert_allclose(back.marginals, prior.marginals)
    np.testing.assert_array_equal(back.support, prior.support)
    assert back.meta == dict(source='site A')
    # a support of its own per column is written by class name
    uneven = prior.with_support([1, 2, 3, 4], [0, 0.5, 1, 0.25])
    back = Prior.load(uneven.save(tmp_path / 'uneven.json'))
    np.testing.assert_array_equal(back.support, [1, 2, 3, 4])


def test_a_support_is_not_written_where_it_would_be_dropped(tmp_path):
    prior = Prior(random_prior(1, K), CLASSES, np.ones(K), np.zeros(K))
    with pytest.raises(ValueError, match='as .json'):
        prior.save(tmp_path / 'site.npy')


def test_nan_metadata_is_refused_by_key(tmp_path):
    with pytest.raises(ValueError, match="the file key 'num_images'"):
        save_prior(tmp_path / 'p.json', random_prior(0, K), CLASSES,
                   num_images=float('nan'))
    prior = Prior(random_prior(0, K), CLASSES, meta=dict(score=np.inf))
    with pytest.raises(ValueError, match="the file key 'score'"):
        prior.save(tmp_path / 'q.json')
    assert not (tmp_path / 'p.json').exists()
    assert not (tmp_path / 'q.json').exists()


def test_an_edit_drops_the_support_and_the_image_counts():
    base = Prior.load(
        prior_dict(
            source='site.json',
            num_images=10,
            images_with_labels=9,
            images_per_class=counts(10, 2, 5, 0)))
    edited = edit_prior(base, ['dog|person=0.9'])
    assert not edited.has_support
    assert 'num_images' not in edited.file_keys()
    assert 'images_with_labels' not in edited.meta
    assert edited.meta['edits'] == ['dog|person=0.9']
    assert edited.matrix[3, 0] == 0.9


def test_load_prior_gives_the_support_keys_it_validated(tmp_path):
    path = save_prior(
        tmp_path / 'p.json',
        random_prior(0, K),
        CLASSES,
        num_images=4,
        images_per_class=counts(1, 2, 3, 4))
    _, meta = load_prior(path, classes=CLASSES[::-1], return_meta=True)
    assert meta['classes'] == CLASSES[::-1]
    assert meta['images_per_class'] == counts(1, 2, 3, 4)
    bad = save_prior(
        tmp_path / 'bad.json',
        random_prior(0, K),
        CLASSES,
        images_per_class=counts(1, 2, 3, 4))
    with pytest.raises(ValueError, match='needs num_images'):
        load_prior(bad)
