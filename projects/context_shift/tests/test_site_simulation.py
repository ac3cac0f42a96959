# Copyright (c) mmcalidet contributors. All rights reserved.
"""Site-simulated training (a rejected recipe, experiments/site_simulation):
a site batch's images all come from its site and carry its statistics, and
the SiteEdgeSampler gives them as the batch's prior."""
import os.path as osp
from functools import partial

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.dataset import DefaultSampler
from mmengine.structures import InstanceData

import testing
from mmcalidet.models.data_preprocessors import EdgeSampler
from projects.context_shift.context_shift.training import cache_dataset_key
from projects.context_shift.experiments.site_simulation.recipe import (
    SiteBatchSampler, SiteEdgeSampler, SiteSimulatedDataset)

K = 5
ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
#: the recipe's config, beside its module in the project's experiments
SITE_CONFIG = osp.join(ROOT, 'projects', 'context_shift', 'experiments',
                       'site_simulation',
                       'calidet_dino_tiny_context-shift_cached_site.py')


#: the shared helpers with this file's K
random_label_lists = partial(testing.random_label_lists, num_classes=K)
brute_force_prior = partial(testing.brute_force_prior, num_classes=K)


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


def test_a_site_prior_measured_on_n_of_its_images():
    lists = random_label_lists(num=400)
    dataset = SiteSimulatedDataset(
        LabelDataset(lists), kinds=('tilt', 'pairs'), min_images=10,
        site_support=(2, 64))
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(6):
        key = dataset.sites.draw_key(rng)
        prior, measured = dataset.site_statistics(key)
        assert 2 <= len(measured) <= 64
        assert set(measured.tolist()) <= set(
            dataset.sites.members(key).tolist())
        np.testing.assert_allclose(
            prior, brute_force_prior([lists[i] for i in measured]),
            atol=1e-6)
        again, same = dataset.site_statistics(key)  # a function of the key
        np.testing.assert_array_equal(same, measured)
        sample = dataset[(0, key)]['data_samples']
        assert sample.site_size == len(measured)
        np.testing.assert_array_equal(sample.site_prior, prior)
        sizes.add(len(measured))
    assert len(sizes) > 1
    for bad in [(0, 4), (8, 4), (float('nan'), 4), (2, 4.5), (2, )]:
        with pytest.raises(ValueError, match='site_support'):
            SiteSimulatedDataset(LabelDataset(lists), site_support=bad)


def test_the_site_mode_carries_the_sites_support():
    lists = random_label_lists()
    e_t = brute_force_prior(lists)
    sampler = SiteEdgeSampler(
        num_classes=K, prior=e_t, mode_probs=dict(site=1), noise_std=0.0,
        support=True)
    dataset, batches = loader_parts(site_prob=1.0, lists=lists)
    batch = next(iter(batches))
    _, samples = sampler(
        torch.zeros(4, 3, 4, 4),
        [dataset[item]['data_samples'] for item in batch])
    members = dataset.sites.members(batch[0][1])
    shares = dataset.sites.presence[members].mean(0)
    for sample in samples:
        assert sample.prior_support.tolist() == [float(len(members))] * K
        np.testing.assert_allclose(sample.prior_marginals.numpy(), shares,
                                   atol=1e-6)
    # a batch of the whole set: E_t's support, as the 'dataset' mode gives
    whole = [dataset[k]['data_samples'] for k in range(4)]
    _, samples = sampler(torch.zeros(4, 3, 4, 4), whole)
    n, p = sampler.sample_support(
        'dataset', [s.gt_instances.labels.numpy() for s in whole], 0)
    for k, sample in enumerate(samples):
        np.testing.assert_allclose(sample.prior_support.numpy(), n[k])
        np.testing.assert_allclose(sample.prior_marginals.numpy(), p[k],
                                   atol=1e-6)
        assert sample.prior_support[0] != len(members)


@pytest.mark.slow
def test_the_site_recipe_trains_with_tools_train(train_recipe):
    """The recipe's config, as a user runs it: tools/train.py on a
    random DINO's cached decoder outputs of generated scenes."""
    log = train_recipe(SITE_CONFIG,
                       'dataset.dataset',
                       'train_dataloader.dataset.min_images=2',
                       'train_dataloader.batch_sampler.site_prob=1.0')
    assert 'Iter(train) [3/3]' in log and 'loss_loma' in log


def test_the_benchmark_finds_the_cache_inside_the_wrapper():
    configs = osp.join(ROOT, 'projects', 'context_shift', 'configs')
    assert cache_dataset_key(SITE_CONFIG) == 'train_dataloader.dataset.dataset'
    assert cache_dataset_key(
        osp.join(configs, 'calidet_dino_tiny_context-shift_cached.py')
    ) == 'train_dataloader.dataset'
    with pytest.raises(ValueError, match='no DecoderCacheDataset'):
        cache_dataset_key(
            osp.join(configs, 'calidet_dino_tiny_context-shift.py'))
