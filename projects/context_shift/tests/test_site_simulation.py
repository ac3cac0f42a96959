# Copyright (c) mmcalidet contributors. All rights reserved.
"""Site-simulated training: the sites are the subpopulations their keys
name, a site batch's images all come from its site and carry its
statistics, and the SiteEdgeSampler gives them as the batch's prior."""
import os.path as osp
import re

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.dataset import DefaultSampler
from mmengine.structures import InstanceData

from mmcalidet.models.data_preprocessors import EdgeSampler
from projects.context_shift.context_shift.site_simulation import (
    VALIDATION_SITES, SimulatedSites, SiteBatchSampler, SiteEdgeSampler,
    SiteSimulatedDataset, make_validation_data, pair_tilt_weights,
    validation_sites)
from projects.context_shift.context_shift.training import cache_dataset_key

K = 5
#: generated scenes small enough for a test
TINY = dict(img_size=64, digit_size=(10, 16), progress=False)
ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def random_label_lists(num=200, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.choice(K, size=rng.integers(0, 4), replace=False)
        for _ in range(num)
    ]


def brute_force_prior(label_lists):
    """E[i, j] = #(images with i and j) / #(images with j), 0.5 in a column
    of an absent class, 1 on the diagonal (the paper's reference code)."""
    prior = np.full((K, K), 0.5)
    for j in range(K):
        with_j = [set(x.tolist()) for x in label_lists if j in x]
        for i in range(K):
            if with_j:
                prior[i, j] = sum(i in s for s in with_j) / len(with_j)
    np.fill_diagonal(prior, 1.0)
    return prior


class LabelDataset(torch.utils.data.Dataset):
    """Items as an mmdet dataset gives them, from label lists."""

    def __init__(self, label_lists):
        self.label_lists = label_lists
        self.metainfo = dict(classes=[f'c{k}' for k in range(K)])

    def __len__(self):
        return len(self.label_lists)

    def get_data_info(self, index):
        return dict(instances=[
            dict(bbox_label=int(c), ignore_flag=0)
            for c in self.label_lists[index]
        ])

    def __getitem__(self, index):
        sample = DetDataSample(metainfo=dict(index=index))
        sample.gt_instances = InstanceData(
            labels=torch.as_tensor(self.label_lists[index]),
            bboxes=torch.zeros(len(self.label_lists[index]), 4))
        return dict(inputs=torch.zeros(3, 4, 4), data_samples=sample)


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


def loader_parts(site_prob, lists=None, seed=0):
    lists = random_label_lists() if lists is None else lists
    dataset = SiteSimulatedDataset(LabelDataset(lists), min_images=10)
    sampler = DefaultSampler(dataset, shuffle=True, seed=seed)
    return dataset, SiteBatchSampler(sampler, 4, site_prob=site_prob)


def test_a_site_batch_comes_from_one_site_and_carries_its_statistics():
    dataset, batches = loader_parts(site_prob=1.0)
    drawn = list(batches)
    assert len(drawn) == 50
    for batch in drawn:
        keys = {key for _, key in batch}
        assert len(keys) == 1
        key = keys.pop()
        members = set(dataset.sites.members(key).tolist())
        assert {index for index, _ in batch} <= members
        for item in batch:
            sample = dataset[item]['data_samples']
            np.testing.assert_array_equal(sample.site_prior,
                                          dataset.sites.statistics(key))
    # the same seed draws the same batches, another epoch others
    assert [b for b in loader_parts(site_prob=1.0)[1]] == drawn
    batches.set_epoch(1)
    assert list(batches) != drawn


def test_without_sites_the_batches_are_the_samplers():
    dataset, batches = loader_parts(site_prob=0.0)
    order = list(batches.sampler)
    assert [i for b in batches for i in b] == order
    assert 'site_prior' not in dataset[order[0]]['data_samples']
    # about half the batches are site batches at site_prob 0.5
    _, half = loader_parts(site_prob=0.5)
    kinds = [isinstance(b[0], tuple) for b in half]
    assert 15 <= sum(kinds) <= 35


def test_the_batch_sampler_needs_the_wrapped_dataset():
    sampler = DefaultSampler(LabelDataset(random_label_lists()), seed=0)
    with pytest.raises(TypeError, match='SiteSimulatedDataset'):
        SiteBatchSampler(sampler, 4)


def test_the_site_mode_gives_each_batch_its_population_statistics():
    lists = random_label_lists()
    e_t = brute_force_prior(lists)
    sampler = SiteEdgeSampler(
        num_classes=K, prior=e_t, mode_probs=dict(site=1), noise_std=0.0)
    dataset, batches = loader_parts(site_prob=1.0, lists=lists)
    batch = next(iter(batches))
    samples = [dataset[item]['data_samples'] for item in batch]
    _, samples = sampler(torch.zeros(4, 3, 4, 4), samples)
    key = batch[0][1]
    for sample in samples:
        np.testing.assert_allclose(sample.prior.numpy(),
                                   dataset.sites.statistics(key))
        assert sample.prior_mode == 'site'
    # a batch of the whole set: its population is the training set, E_t
    samples = [dataset[k]['data_samples'] for k in range(4)]
    _, samples = sampler(torch.zeros(4, 3, 4, 4), samples)
    for sample in samples:
        np.testing.assert_allclose(sample.prior.numpy(), e_t, atol=1e-6)
    # one noise draw per site: a site batch's images share their prior
    noisy = SiteEdgeSampler(
        num_classes=K, prior=e_t, mode_probs=dict(site=1), noise_std=0.16)
    samples = [dataset[item]['data_samples'] for item in batch]
    _, samples = noisy(torch.zeros(4, 3, 4, 4), samples)
    assert all(torch.equal(s.prior, samples[0].prior) for s in samples)
    assert not torch.allclose(samples[0].prior,
                              torch.as_tensor(dataset.sites.statistics(key)))
    # the library's sampler does not know the mode
    with pytest.raises(ValueError, match="unknown mode.*'site'"):
        EdgeSampler(num_classes=K, prior=e_t, mode_probs=dict(site=1))


@pytest.mark.slow
def test_the_site_recipe_trains_with_tools_train(train_recipe):
    """The recipe's config, as a user runs it: tools/train.py on a
    random DINO's cached decoder outputs of generated scenes."""
    log = train_recipe('calidet_dino_tiny_context-shift_cached_site.py',
                       'dataset.dataset',
                       'train_dataloader.dataset.min_images=2',
                       'train_dataloader.batch_sampler.site_prob=1.0')
    assert 'Iter(train) [3/3]' in log and 'loss_loma' in log


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


def test_the_benchmark_finds_the_cache_inside_the_wrapper():
    configs = osp.join(ROOT, 'projects', 'context_shift', 'configs')
    assert cache_dataset_key(
        osp.join(configs, 'calidet_dino_tiny_context-shift_cached_site.py')
    ) == 'train_dataloader.dataset.dataset'
    assert cache_dataset_key(
        osp.join(configs, 'calidet_dino_tiny_context-shift_cached.py')
    ) == 'train_dataloader.dataset'
    with pytest.raises(ValueError, match='no DecoderCacheDataset'):
        cache_dataset_key(
            osp.join(configs, 'calidet_dino_tiny_context-shift.py'))
