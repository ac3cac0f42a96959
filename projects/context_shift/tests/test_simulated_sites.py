# Copyright (c) mmcalidet contributors. All rights reserved.
"""Simulated sites: the sites are the subpopulations their keys name, and
the recipe-selection (validation) sites follow their rules."""
import os.path as osp
import re
from functools import partial

import numpy as np
import pytest

import testing
from projects.context_shift.context_shift.simulated_sites import (
    VALIDATION_SITES, SimulatedSites, make_validation_data, pair_tilt_weights,
    validation_sites)

K = 5
#: generated scenes small enough for a test
TINY = dict(img_size=64, digit_size=(10, 16), progress=False)
ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


#: the shared helpers with this file's K
random_label_lists = partial(testing.random_label_lists, num_classes=K)
brute_force_prior = partial(testing.brute_force_prior, num_classes=K)


def test_sites_are_the_subpopulations_their_keys_name():
    lists = random_label_lists()
    sites = SimulatedSites(lists, K, min_images=10)
    for c in range(K):
        with_c = [k for k, x in enumerate(lists) if c in x]
        assert sites.members(('with', c)).tolist() == with_c
        assert sites.members(
            ('without',
             c)).tolist() == [k for k in range(len(lists)) if k not in with_c]
        np.testing.assert_allclose(
            sites.statistics(('with', c)),
            brute_force_prior([lists[k] for k in with_c]),
            atol=1e-6)
    # a tilt is a quarter of the set, the same for the same seed
    tilt = sites.members(('tilt', 7))
    assert len(tilt) == 50 and len(set(tilt.tolist())) == 50
    np.testing.assert_array_equal(tilt, sites.members(('tilt', 7)))
    assert not np.array_equal(tilt, sites.members(('tilt', 8)))
    np.testing.assert_allclose(
        sites.statistics(('tilt', 7)),
        brute_force_prior([lists[k] for k in tilt]),
        atol=1e-6)


def test_a_tilt_favours_the_classes_it_weights_up():
    lists = random_label_lists(num=2000)
    sites = SimulatedSites(lists, K, tilt_std=2.0)
    seed = 3
    z = np.random.default_rng(seed).normal(0.0, 2.0, K)
    top, bottom = int(np.argmax(z)), int(np.argmin(z))
    members = sites.members(('tilt', seed))
    share = sites.presence[members].mean(0)
    overall = sites.presence.mean(0)
    assert share[top] > overall[top] + 0.1
    assert share[bottom] < overall[bottom] - 0.1


def test_small_sites_are_not_drawn_and_bad_options_are_named():
    # class 4 is in 3 of 100 images: no 'with 4' site of 10 images
    lists = [np.array([0, 4])] * 3 + [np.array([1])] * 97
    sites = SimulatedSites(lists, K, kinds=('with', ), min_images=10)
    rng = np.random.default_rng(0)
    assert {sites.draw_key(rng) for _ in range(50)} == {('with', 1)}
    with pytest.raises(ValueError, match='kinds'):
        SimulatedSites(lists, K, kinds=('cluster', ))
    with pytest.raises(ValueError, match='no class has 200 images'):
        SimulatedSites(lists, K, kinds=('with', ), min_images=200)
    with pytest.raises(ValueError, match='image 0 has a class outside'):
        SimulatedSites([np.array([K])], K)
    for option, bad in [('tilt_std', float('nan')), ('tilt_std', -1.0),
                        ('tilt_fraction', 0.0), ('tilt_fraction', 1.5),
                        ('pair_strength', 0.0), ('pair_strength', np.inf)]:
        with pytest.raises(ValueError, match=option):
            SimulatedSites(lists, K, **{option: bad})


def test_validation_sites_are_disjoint_and_follow_their_rules():
    # training: classes 0-1 go together, 2-3 go together, 4 alone
    rng = np.random.default_rng(0)
    kinds = [[0, 1], [2, 3], [4], [0, 1, 4], [2, 3, 4]]
    train = [np.array(kinds[k]) for k in rng.integers(len(kinds), size=400)]
    pool = random_label_lists(num=1200, seed=1)
    sites = validation_sites(pool, train, K, per_site=100, seed=0)
    assert list(sites) == list(VALIDATION_SITES)
    taken = np.concatenate([s['members'] for s in sites.values()])
    assert len(taken) == len(set(taken.tolist()))
    assert all(len(s['members']) <= 100 for s in sites.values())
    # rare pairs: never seen together in training (0 with 2, 1 with 3, ...)
    rare = {(0, 2), (0, 3), (1, 2), (1, 3)}
    for k in sites['sim_rare_pairs']['members']:
        labels = set(pool[k].tolist())
        assert any(a in labels and b in labels for a, b in rare), labels
    # the dropped class is absent from its site
    dropped = int(sites['sim_without']['rule'].split()[-1])
    assert not any(dropped in pool[k] for k in sites['sim_without']['members'])


def _presence(label_lists):
    presence = np.zeros((len(label_lists), K), dtype=bool)
    for row, labels in zip(presence, label_lists):
        row[np.asarray(labels, dtype=int)] = True
    return presence


def test_pair_tilt_holds_the_marginals_and_raises_the_pairs():
    presence = _presence(random_label_lists(num=600, seed=2))
    pairs = [(0, 1), (2, 4)]
    weights = pair_tilt_weights(presence, pairs, strength=4.0)
    assert weights.shape == (600, ) and np.all(weights > 0)
    assert weights.sum() == pytest.approx(1.0)
    # each class's (weighted) image frequency is the pool's
    np.testing.assert_allclose(weights @ presence, presence.mean(0),
                               atol=1e-6)
    # the chosen pairs go together more often, measurably
    for a, b in pairs:
        both = presence[:, a] & presence[:, b]
        assert weights @ both > 1.3 * both.mean(), (a, b)
    # deterministic; a strength below 1 tilts the other way
    np.testing.assert_array_equal(
        weights, pair_tilt_weights(presence, pairs, strength=4.0))
    low = pair_tilt_weights(presence, pairs, strength=0.25)
    both = presence[:, 0] & presence[:, 1]
    assert low @ both < both.mean()


@pytest.mark.parametrize('kwargs, match', [
    (dict(pairs=[]), 'at least one class pair'),
    (dict(pairs=[(0, 0)]), 'two different classes'),
    (dict(pairs=[(0, K)]), 'two different classes'),
    (dict(pairs=[(0, 1)], strength=0.0), 'strength'),
    (dict(pairs=[(0, 1)], strength=float('nan')), 'strength'),
    (dict(pairs=[(0, 1)], max_iter=0), 'max_iter'),
])
def test_pair_tilt_refuses_bad_input(kwargs, match):
    presence = _presence(random_label_lists(num=50))
    with pytest.raises(ValueError, match=match):
        pair_tilt_weights(presence, **kwargs)
    with pytest.raises(ValueError, match='presence'):
        pair_tilt_weights(presence.astype(int), [(0, 1)])


def test_the_sim_pairs_site_tilts_pairs_not_classes():
    pool = random_label_lists(num=3000, seed=3)
    train = random_label_lists(num=400, seed=4)
    sites = validation_sites(pool, train, K, per_site=300, seed=0)
    again = validation_sites(pool, train, K, per_site=300, seed=0)
    assert list(sites)[-1] == 'sim_pairs'
    np.testing.assert_array_equal(sites['sim_pairs']['members'],
                                  again['sim_pairs']['members'])
    taken = np.concatenate([s['members'] for s in sites.values()])
    assert len(taken) == len(set(taken.tolist()))
    presence = _presence(pool)
    members = presence[sites['sim_pairs']['members']]
    rule = sites['sim_pairs']['rule']
    pairs = [(int(a), int(b))
             for a, b in re.findall(r'(\d+)-(\d+)', rule)]
    assert len(pairs) == 3
    # the class frequencies stay near the pool's, the pairs rise
    np.testing.assert_allclose(members.mean(0), presence.mean(0), atol=0.07)
    rise = [(members[:, a] & members[:, b]).mean() -
            (presence[:, a] & presence[:, b]).mean() for a, b in pairs]
    assert np.mean(rise) > 0.02, rise


def test_a_pairs_site_tilts_its_pairs_and_holds_the_classes():
    lists = random_label_lists(num=3000, seed=5)
    presence = _presence(lists)
    sites = SimulatedSites(lists, K, kinds=('pairs', ), tilt_fraction=0.15)
    rng = np.random.default_rng(0)
    keys = [sites.draw_key(rng) for _ in range(6)]
    assert {kind for kind, _ in keys} == {'pairs'}
    rises = []
    for key in keys:
        members = sites.members(key)
        assert len(members) == 450 and len(set(members.tolist())) == 450
        np.testing.assert_array_equal(members, sites.members(key))
        site = presence[members]
        # each class about as frequent as in the set, the pairs more so
        np.testing.assert_allclose(site.mean(0), presence.mean(0),
                                   atol=0.06)
        pairs = sites.site_pairs(key[1])
        assert 1 <= len(pairs) <= 3
        assert all(presence[:, a].dot(presence[:, b]) > 0 for a, b in pairs)
        rises += [(site[:, a] & site[:, b]).mean() -
                  (presence[:, a] & presence[:, b]).mean() for a, b in pairs]
        np.testing.assert_allclose(
            sites.statistics(key), brute_force_prior([lists[i]
                                                      for i in members]),
            atol=1e-6)
    assert np.mean(rises) > 0.02, rises
    # a set where no image shows two classes has no pair to tilt
    with pytest.raises(ValueError, match='no class has'):
        SimulatedSites([np.array([k % K]) for k in range(40)], K,
                       kinds=('pairs', ))


def test_a_validation_folder_has_the_simulated_sites_as_its_val_split(
        tmp_path):
    import json
    out = str(tmp_path / 'validation')
    meta = make_validation_data(
        out, seed=0, pool_size=40, per_site=8, num_train=30, **TINY)
    with open(osp.join(out, 'annotations', 'instances_val.json')) as f:
        val = json.load(f)
    sites = {img['site'] for img in val['images']}
    assert sites and sites <= set(VALIDATION_SITES)
    assert set(meta['epsilon']) == sites == set(meta['validation_sites'])
    ids = {img['id'] for img in val['images']}
    assert {a['image_id'] for a in val['annotations']} <= ids
    for site in sites:
        with open(osp.join(out, 'annotations',
                           f'instances_val_{site}.json')) as f:
            one = json.load(f)
        assert len(one['images']) == meta['validation_sites'][site]['images']
        assert osp.isfile(osp.join(out, 'priors', f'E_{site}.json'))
    assert not osp.exists(osp.join(out, 'priors', 'E_pool.json'))
