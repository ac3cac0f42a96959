# Copyright (c) mmcalidet contributors. All rights reserved.
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmengine.structures import InstanceData

from mmcalidet.models import EdgeSampler
from mmcalidet.priors import batch_prior, sample_prior, save_prior
from testing import demo_batch

K = 8
LABELS = [[0, 1, 1], [2], [], [1, 3, 5]]


def dataset_prior(seed=0):
    rng = np.random.default_rng(seed)
    prior = rng.uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def run(sampler, labels=LABELS, seed=0):
    batch = demo_batch(labels, size=8, seed=seed)
    inputs = torch.stack(batch['inputs']).float()
    out_inputs, samples = sampler(inputs, batch['data_samples'])
    assert out_inputs is inputs
    return samples


def priors_of(samples):
    return np.stack([s.prior.numpy() for s in samples]).astype(np.float64)


def only(mode, noise_std=0.0, **kwargs):
    return EdgeSampler(
        num_classes=K,
        prior=dataset_prior(),
        mode_probs={mode: 1.0},
        noise_std=noise_std,
        **kwargs)


def test_sample_mode_gives_each_sample_its_statistics():
    samples = run(only('sample'))
    for s, labels in zip(samples, LABELS):
        expected = sample_prior(K, labels)
        np.testing.assert_allclose(s.prior.numpy(), expected)
        np.testing.assert_allclose(s.sample_prior.numpy(), expected)
        assert s.prior.dtype == torch.float32
        assert s.metainfo['prior_mode'] == 'sample'


def test_batch_mode_gives_the_batch_statistics():
    samples = run(only('batch'))
    expected = batch_prior(K, LABELS)
    for s, labels in zip(samples, LABELS):
        np.testing.assert_allclose(s.prior.numpy(), expected, atol=1e-7)
        np.testing.assert_allclose(s.sample_prior.numpy(),
                                   sample_prior(K, labels))


def test_dataset_mode():
    for s in run(only('dataset')):
        np.testing.assert_allclose(s.prior.numpy(), dataset_prior(), atol=1e-7)
    # modes that are not the paper's are refused by name
    for mode in ('flat', 'flip', 'subpopulation'):
        with pytest.raises(ValueError, match='unknown mode'):
            only(mode)


def test_group_mode_gives_group_statistics():
    samples = run(only('group', group_size=2))
    for k, s in enumerate(samples):
        group = LABELS[(k // 2) * 2:(k // 2) * 2 + 2]
        np.testing.assert_allclose(
            s.prior.numpy(), batch_prior(K, group), atol=1e-7)


@pytest.mark.parametrize('mode', ['sample', 'batch', 'dataset'])
def test_noise_clip_and_diagonal(mode):
    clean = priors_of(run(only(mode)))
    noisy = priors_of(run(only(mode, noise_std=0.16, seed=3)))
    assert noisy.min() >= 0.0 and noisy.max() <= 1.0
    for p in noisy:
        np.testing.assert_array_equal(np.diagonal(p), np.ones(K))
    diff = (noisy - clean)[:, ~np.eye(K, dtype=bool)]
    assert np.abs(diff).max() > 0.05
    # away from the clip bounds the noise is N(0, 0.16^2)
    inner = diff[(clean[:, ~np.eye(K, dtype=bool)] == 0.5) |
                 ((clean[:, ~np.eye(K, dtype=bool)] > 0.1) &
                  (clean[:, ~np.eye(K, dtype=bool)] < 0.9))]
    inner = inner[np.abs(inner) < 0.4]
    assert 0.12 < inner.std() < 0.2
    if mode != 'sample':  # one noisy prior shared by the whole batch
        for p in noisy[1:]:
            np.testing.assert_array_equal(p, noisy[0])
    else:
        assert not np.array_equal(noisy[0], noisy[1])


def test_seeded_runs_repeat():

    def outputs(sampler):
        return [priors_of(run(sampler, seed=k)) for k in range(6)]

    kwargs = dict(
        num_classes=K, prior=dataset_prior(), noise_std=0.16, seed=123)
    first = outputs(EdgeSampler(**kwargs))
    second = outputs(EdgeSampler(**kwargs))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    other = outputs(EdgeSampler(**dict(kwargs, seed=124)))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))

    # without a seed: numpy's global RNG (seeded by mmengine's randomness)
    np.random.seed(7)
    first = outputs(EdgeSampler(**dict(kwargs, seed=None)))
    np.random.seed(7)
    second = outputs(EdgeSampler(**dict(kwargs, seed=None)))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_modes_are_drawn_with_their_probabilities():
    sampler = EdgeSampler(num_classes=K, prior=dataset_prior(), seed=0)
    counts = {}
    for _ in range(600):
        mode, _ = sampler._draw()
        counts[mode] = counts.get(mode, 0) + 1
    assert set(counts) == {'sample', 'batch', 'dataset'}
    assert all(150 < c < 250 for c in counts.values()), counts
    skewed = EdgeSampler(
        num_classes=K, mode_probs=dict(sample=3, group=1, dataset=0), seed=0)
    draws = [skewed._draw()[0] for _ in range(400)]
    assert set(draws) == {'sample', 'group'}
    assert 250 < draws.count('sample') < 350


def test_crowd_boxes_do_not_count():
    batch = demo_batch([[1]], size=8)
    sample = batch['data_samples'][0]
    sample.ignored_instances = InstanceData(
        bboxes=torch.zeros(1, 4), labels=torch.tensor([4]))
    sampler = only('sample')
    sampler(torch.stack(batch['inputs']).float(), [sample])
    np.testing.assert_allclose(sample.sample_prior.numpy(),
                               sample_prior(K, [1]))
    np.testing.assert_allclose(sample.prior.numpy(), sample_prior(K, [1]))


def test_invalid_arguments():
    with pytest.raises(ValueError, match='unknown mode'):
        EdgeSampler(
            num_classes=K,
            prior=dataset_prior(),
            mode_probs=dict(sample=1, everything=1))
    # K and E_t may come from a detector later: checked at the first batch
    with pytest.raises(ValueError, match='needs a prior'):
        run(EdgeSampler(num_classes=K))
    with pytest.raises(ValueError, match='num_classes is not set'):
        run(EdgeSampler(mode_probs=dict(sample=1)))
    with pytest.raises(ValueError, match='batch_scope'):
        EdgeSampler(num_classes=K, batch_scope='node')
    with pytest.raises(ValueError, match='non-negative'):
        EdgeSampler(num_classes=K, mode_probs=dict(sample=-1, batch=2))
    with pytest.raises(ValueError, match='expected 8'):
        EdgeSampler(num_classes=K, prior=np.eye(5))
    with pytest.raises(ValueError, match='no shipped prior'):
        EdgeSampler(num_classes=K, prior='no_such_prior')
    EdgeSampler(num_classes=K, mode_probs=dict(sample=1, batch=1))


def test_runs_as_a_batch_augment_of_the_data_preprocessor():
    preprocessor = DetDataPreprocessor(
        mean=[0, 0, 0],
        std=[1, 1, 1],
        batch_augments=[
            dict(type='EdgeSampler', num_classes=K, prior=dataset_prior())
        ])
    batch = demo_batch(LABELS, size=8)
    out = preprocessor(batch, training=True)
    for s in out['data_samples']:
        assert s.prior.shape == (K, K) and s.sample_prior.shape == (K, K)
    out = preprocessor(demo_batch(LABELS, size=8), training=False)
    assert all('prior' not in s for s in out['data_samples'])


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _dist_worker(rank, world_size, port, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        labels = [LABELS[:2], LABELS[2:]][rank]
        results = []
        for mode in ('batch', 'group', 'sample'):
            # different seeds per rank: rank 0's draws must win everywhere
            sampler = EdgeSampler(
                num_classes=K,
                mode_probs={mode: 1.0},
                noise_std=0.0,
                group_size=3,
                seed=rank,
                batch_scope='global')
            results.append(priors_of(run(sampler, labels=labels)))
        noisy = EdgeSampler(
            num_classes=K,
            prior=dataset_prior(),
            noise_std=0.16,
            seed=rank,
            batch_scope='global')
        results.append(priors_of(run(noisy, labels=labels)))
        # the default, the paper's: E_b of each rank's own mini-batch
        for mode in ('batch', 'group'):
            local = EdgeSampler(
                num_classes=K,
                mode_probs={mode: 1.0},
                noise_std=0.0,
                group_size=3)
            results.append(priors_of(run(local, labels=labels)))
        queue.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_distributed_batch_scope():
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_dist_worker, args=(r, 2, port, queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    batch0, group0, sample0, noisy0, local_b0, local_g0 = results[0]
    batch1, group1, sample1, noisy1, local_b1, local_g1 = results[1]
    # local scope: rank 0 has LABELS[:2], rank 1 LABELS[2:]
    for p in local_b0:
        np.testing.assert_allclose(p, batch_prior(K, LABELS[:2]), atol=1e-7)
    for p in local_b1:
        np.testing.assert_allclose(p, batch_prior(K, LABELS[2:]), atol=1e-7)
    for p in [*local_g0]:  # a group of 3 within 2 local images
        np.testing.assert_allclose(p, batch_prior(K, LABELS[:2]), atol=1e-7)
    assert not np.allclose(batch_prior(K, LABELS[:2]), batch_prior(K, LABELS))
    global_eb = batch_prior(K, LABELS)
    for p in [*batch0, *batch1]:
        np.testing.assert_allclose(p, global_eb, atol=1e-7)
    # groups of 3 over the global batch: samples 0-2, then 3
    np.testing.assert_allclose(
        group0[1], batch_prior(K, LABELS[:3]), atol=1e-7)
    np.testing.assert_allclose(
        group1[0], batch_prior(K, LABELS[:3]), atol=1e-7)
    np.testing.assert_allclose(
        group1[1], batch_prior(K, LABELS[3:]), atol=1e-7)
    for p, labels in zip([*sample0, *sample1], LABELS):
        np.testing.assert_allclose(p, sample_prior(K, labels), atol=1e-7)
    # rank 0's mode and noise on both ranks, over the global batch
    ref = EdgeSampler(
        num_classes=K, prior=dataset_prior(), noise_std=0.16, seed=0)
    mode, noise_seed = ref._draw()
    assert EdgeSampler(
        num_classes=K, prior=dataset_prior(), seed=1)._draw()[1] != noise_seed
    expected = ref.sample_priors(mode, [np.asarray(x) for x in LABELS],
                                 noise_seed)
    np.testing.assert_allclose(
        np.concatenate([noisy0, noisy1]), expected, atol=1e-6)


def test_named_dataset_prior_is_reordered_to_the_dataset_classes(tmp_path):
    def dataset_mode(prior, **kwargs):
        return EdgeSampler(
            num_classes=K,
            prior=prior,
            mode_probs=dict(dataset=1.0),
            noise_std=0.0,
            **kwargs)

    classes = [f'class{k}' for k in range(K)]
    order = np.random.default_rng(1).permutation(K)
    prior = dataset_prior()
    path = save_prior(
        tmp_path / 'shuffled.json',
        prior[np.ix_(order, order)],
        classes=[classes[k] for k in order])
    # classes known at construction
    sampler = dataset_mode(str(path), classes=classes)
    np.testing.assert_allclose(sampler.dataset_prior, prior)
    # or given later (a CaliDet detector does, from its dataset_meta)
    sampler = dataset_mode(str(path))
    np.testing.assert_allclose(sampler.dataset_prior,
                               prior[np.ix_(order, order)])
    sampler.set_classes(classes)
    np.testing.assert_allclose(sampler.dataset_prior, prior)
    samples = run(sampler)
    np.testing.assert_allclose(priors_of(samples)[0], prior, atol=1e-7)
    with pytest.raises(ValueError, match=r'shuffled\.json.*unknown'):
        sampler.set_classes(classes[:-1] + ['unknown'])
    np.testing.assert_allclose(sampler.dataset_prior, prior)
    # an unnamed matrix is taken to be in the dataset's order
    sampler = dataset_mode(prior)
    sampler.set_classes(classes[::-1])
    np.testing.assert_array_equal(sampler.dataset_prior, prior)
