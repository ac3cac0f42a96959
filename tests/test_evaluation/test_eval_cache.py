# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs: re-scoring equals a full forward."""
import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from mmcalidet.evaluation import (HiddenStateCache, Rescorer,
                                  cache_hidden_states, cache_images)
from mmcalidet.priors import flat_prior, sample_prior
from mmcalidet.testing import get_config

K = 80


def tiny(name='calidet/calidet_dino_tiny_coco-mini.py', images=4, size=96):
    init_default_scope('mmdet')
    cfg = get_config(name)
    cfg.test_dataloader.dataset.indices = images
    cfg.test_dataloader.dataset.pipeline[1].scale = (size, size)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    loader = Runner.build_dataloader(cfg.test_dataloader)
    model.dataset_meta = dict(loader.dataset.metainfo)
    model.cfg = cfg
    return model.eval(), loader


@pytest.fixture(scope='module')
def cali():
    model, loader = tiny()
    return model, loader, cache_hidden_states(model, loader, progress=False)


def random_prior(seed):
    prior = np.random.default_rng(seed).uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def full_forward(model, loader, per_sample=None):
    out = []
    with torch.no_grad():
        for batch in loader:
            if per_sample is not None:
                batch = dict(batch)
                samples = []
                for ds in batch['data_samples']:
                    ds = ds.clone()
                    ds.prior = torch.as_tensor(per_sample(ds))
                    samples.append(ds)
                batch['data_samples'] = samples
            out += [ds.pred_instances for ds in model.test_step(batch)]
    return out


def assert_same(cached, full):
    assert len(cached) == len(full)
    for a, b in zip(cached, full):
        assert torch.equal(a.labels, b.labels)
        torch.testing.assert_close(a.scores, b.scores, atol=1e-6, rtol=0)
        torch.testing.assert_close(a.bboxes, b.bboxes, atol=1e-4, rtol=0)


def test_rescore_equals_full_forward_under_injected_priors(cali):
    model, loader, cache = cali
    rescorer = Rescorer(model, cache, batch_size=3)  # other batches
    saved = model.get_prior()
    try:
        for prior in (random_prior(0), flat_prior(K)):
            model.set_prior(prior)
            assert_same(rescorer.predict(prior), full_forward(model, loader))
        # prior=None: the model's deployment prior
        assert_same(rescorer.predict(None), full_forward(model, loader))
    finally:
        model.set_prior(saved)
    # the prior matters (otherwise equality above proves little)
    a, b = rescorer.predict(random_prior(0)), rescorer.predict(flat_prior(K))
    assert any(not torch.equal(x.scores, y.scores) for x, y in zip(a, b))


def test_rescore_equals_full_forward_with_per_sample_priors(cali):
    model, loader, cache = cali
    labels = cache.gt_label_lists()
    ids = cache.img_ids()
    by_id = {i: sample_prior(K, lab) for i, lab in zip(ids, labels)}
    full = full_forward(model, loader, lambda ds: by_id[ds.img_id])
    rescorer = Rescorer(model, cache)
    per_image = rescorer.predict(
        lambda idx: np.stack([by_id[ids[k]] for k in idx]))
    assert_same(per_image, full)
    # a stack aligned with the requested images, in another order
    order = [3, 1]
    stack = np.stack([by_id[ids[k]] for k in order])
    assert_same(rescorer.predict(stack, order), [full[k] for k in order])


def test_rescoring_does_not_run_backbone_or_transformer(cali, monkeypatch):
    model, loader, cache = cali

    def boom(*args, **kwargs):
        raise AssertionError('the cache must be used')

    for name in ('extract_feat', 'forward_transformer'):
        monkeypatch.setattr(model, name, boom)
    preds = Rescorer(model, cache).predict(random_prior(1))
    assert len(preds) == len(cache) == 4


def test_cache_pass_runs_each_batch_once(cali, monkeypatch):
    model, loader, _ = cali
    calls, outputs = [], []
    original = model.forward_transformer

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, 'forward_transformer', counted)
    cache = cache_hidden_states(
        model,
        loader,
        progress=False,
        callback=lambda i, batch, out: outputs.extend(out))
    assert len(calls) == len(loader) == 2
    assert cache.batch_ids == [0, 0, 1, 1]
    assert cache.layer_index == 1  # 2 decoder layers; not the encoder's
    # the callback sees what model.test_step returns
    assert_same([o.pred_instances for o in outputs],
                full_forward(model, loader))


def test_cache_memory_layout_and_spill(cali, tmp_path):
    model, loader, cache = cali
    q = model.num_queries
    d = model.bbox_head.embed_dims
    assert (cache.num_queries, cache.embed_dims) == (q, d)
    assert cache.bytes_per_image == q * (d + 4) * 4
    assert cache.nbytes == 4 * cache.bytes_per_image
    spilled = cache_hidden_states(
        model, loader, spill_dir=str(tmp_path / 'spill'), progress=False)
    assert sorted(p.name for p in (tmp_path / 'spill').iterdir()) == [
        'boxes_000000.npy', 'hidden_000000.npy'
    ]
    h1, b1, s1 = cache.get([2, 0])
    h2, b2, s2 = spilled.get([2, 0])
    assert torch.equal(h1, h2) and torch.equal(b1, b2)
    assert [s.img_id for s in s1] == [s.img_id for s in s2]
    half = HiddenStateCache(dtype=torch.float16)
    half.add(h1, b1, s1, 0)
    assert half.bytes_per_image == cache.bytes_per_image // 2
    with pytest.raises(ValueError, match='float32 or float16'):
        HiddenStateCache(dtype=torch.float64)
    with pytest.raises(ValueError, match='do not match'):
        half.add(h1[:, :5], b1[:, :5], s1, 1)


def test_prior_argument_errors(cali):
    model, _, cache = cali
    rescorer = Rescorer(model, cache)
    with pytest.raises(ValueError, match='shape'):
        rescorer.predict(np.eye(3))
    with pytest.raises(ValueError, match='shape'):
        rescorer.predict(np.stack([flat_prior(K)] * 3))  # 4 images
    with pytest.raises(ValueError, match='baselines for plain'):
        Rescorer(model, cache, correction=lambda x, p: x)


def test_plain_detector_and_images():
    model, loader = tiny('calidet/dino_tiny_coco-mini.py', images=2)
    cache = cache_hidden_states(model, loader, progress=False)
    rescorer = Rescorer(model, cache)
    assert not rescorer.calibratable
    assert_same(rescorer.predict(), full_forward(model, loader))
    with pytest.raises(ValueError, match='takes no prior'):
        rescorer.predict(flat_prior(K))
    # images by path, through the model's test pipeline
    paths = [ds.img_path for ds in cache.data_samples][::-1]
    by_path = cache_images(model, paths, batch_size=2)
    assert by_path.img_ids() == [0, 1]
    assert [ds.img_path for ds in by_path.data_samples] == paths
    # the same batch as the loader's (reversed): the same hidden states
    h1, _, _ = cache.get([1, 0])
    h2, _, _ = by_path.get([0, 1])
    torch.testing.assert_close(h1, h2, atol=1e-5, rtol=0)
