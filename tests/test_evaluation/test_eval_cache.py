# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs: re-scoring equals a full forward, in memory and
from a cache folder that later runs reuse."""
import json
import os
import os.path as osp
import runpy

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, save_checkpoint

from mmcalidet.decoder_cache import DecoderCacheWriter
from mmcalidet.evaluation import Rescorer, cache_hidden_states, cache_images
from mmcalidet.priors import flat_prior, sample_prior
from testing import PROJECT_ROOT, get_config

K = 80
CALI = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
SMALL = dict(
    max_images=2,
    batch_size=2,
    device='cpu',
    progress=False,
    cfg_options={'test_dataloader.dataset.pipeline.1.scale': (96, 96)})


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


def test_remembered_predictions_are_scored_once(cali):
    """While remembering, a (shared prior, image list) scored again gives
    the same predictions back without scoring; other priors, other image
    lists and per-image priors are scored."""
    model, _, cache = cali
    rescorer = Rescorer(model, cache, batch_size=3)
    first = rescorer.predict(random_prior(0), [0, 2, 3])
    rescorer.remember()
    try:
        kept = rescorer.predict(random_prior(0), [0, 2, 3])
        assert_same(kept, first)
        again = rescorer.predict(
            torch.as_tensor(random_prior(0)), np.array([0, 2, 3]))
        assert all(a is b for a, b in zip(again, kept))
        assert rescorer.calls == dict(scored=2, reused=1)
        rescorer.predict(random_prior(0), [0, 3, 2])  # another order
        rescorer.predict(flat_prior(K), [0, 2, 3])
        with rescorer.keeping_none():
            rescorer.predict(random_prior(1), [0])
            # kept ones are still given back
            assert rescorer.predict(random_prior(0), [0, 2, 3])[0] is kept[0]
        rescorer.predict(random_prior(1), [0])
        assert rescorer.calls == dict(scored=6, reused=2)
    finally:
        rescorer.remember(False)
    assert rescorer.predict(random_prior(0), [0, 2, 3])[0] is not kept[0]


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


def test_cache_memory_layout(cali):
    model, loader, cache = cali
    q = model.num_queries
    d = model.bbox_head.embed_dims
    assert (cache.num_queries, cache.embed_dims) == (q, d)
    assert cache.folder is None and cache.num_layers == 1
    assert cache.bytes_per_image == q * (d + 4) * 4
    assert cache.nbytes == 4 * cache.bytes_per_image
    h, b, s = cache.get([2, 0])
    half = DecoderCacheWriter(dtype=torch.float16)
    half.add(h[None], b[None], s, 0)
    half = half.commit()
    # float16 hidden states, float32 boxes
    assert half.bytes_per_image == q * d * 2 + q * 4 * 4
    with pytest.raises(ValueError, match='float32 or float16'):
        DecoderCacheWriter(dtype=torch.float64)
    writer = DecoderCacheWriter()
    writer.add(h[None], b[None], s, 0)
    with pytest.raises(ValueError, match='do not match'):
        writer.add(h[None, :, :5], b[None, :, :5], s, 1)


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


def no_trunk(monkeypatch, model=None):
    """Make any run of the backbone or transformer fail."""
    import mmcalidet.decoder_cache.build as build

    def boom(*args, **kwargs):
        raise AssertionError('the cache folder must be reused')

    monkeypatch.setattr(build, 'run_decoder', boom)
    if model is not None:
        for name in ('extract_feat', 'forward_transformer'):
            monkeypatch.setattr(model, name, boom)


def test_cache_folder_round_trip_and_reuse(cali, tmp_path, monkeypatch):
    model, loader, memory = cali
    fingerprint = dict(checkpoint=dict(sha1='a'), layers='last')
    cache = cache_hidden_states(
        model,
        loader,
        cache_dir=str(tmp_path),
        fingerprint=fingerprint,
        progress=False)
    assert not cache.reused
    assert osp.dirname(cache.folder) == str(tmp_path)
    assert os.listdir(tmp_path) == [osp.basename(cache.folder)]
    assert osp.basename(cache.folder).startswith('decoder_cache-')
    # re-scored from the folder: the model's own forward
    assert_same(Rescorer(model, cache).predict(), full_forward(model, loader))
    # a second run with the same fingerprint maps the folder, no trunk
    no_trunk(monkeypatch, model)
    again = cache_hidden_states(
        model,
        loader,
        cache_dir=str(tmp_path),
        fingerprint=fingerprint,
        progress=False)
    assert again.reused and again.folder == cache.folder
    prior = random_prior(2)
    assert_same(
        Rescorer(model, again).predict(prior),
        Rescorer(model, memory).predict(prior))
    # what the protocol reads besides the arrays
    assert again.batch_ids == memory.batch_ids == [0, 0, 1, 1]
    assert again.img_ids() == memory.img_ids()
    assert [a.tolist() for a in again.gt_label_lists()
            ] == [a.tolist() for a in memory.gt_label_lists()]
    loaded = [ds for batch in loader for ds in batch['data_samples']]
    for a, b in zip(again.data_samples, loaded):
        assert a.img_id == b.img_id and a.img_path == b.img_path
        assert tuple(a.img_shape) == tuple(b.img_shape)
        assert tuple(a.scale_factor) == tuple(b.scale_factor)
        assert torch.equal(a.gt_instances.labels, b.gt_instances.labels)
    # another fingerprint: another folder (made, so the trunk would run)
    with pytest.raises(AssertionError, match='must be reused'):
        cache_hidden_states(
            model,
            loader,
            cache_dir=str(tmp_path),
            fingerprint=dict(fingerprint, checkpoint=dict(sha1='b')),
            progress=False)
    assert os.listdir(tmp_path) == [osp.basename(cache.folder)]


def test_torn_cache_folder_is_made_again(cali, tmp_path, capsys):
    model, loader, memory = cali
    fingerprint = dict(checkpoint=dict(sha1='a'))
    cache = cache_hidden_states(
        model,
        loader,
        cache_dir=str(tmp_path),
        fingerprint=fingerprint,
        progress=False)
    path = osp.join(cache.folder, 'hidden.npy')
    with open(path, 'r+b') as f:
        f.truncate(osp.getsize(path) // 2)
    again = cache_hidden_states(
        model,
        loader,
        cache_dir=str(tmp_path),
        fingerprint=fingerprint,
        progress=False,
        logger=print)
    assert not again.reused and again.folder == cache.folder
    out = capsys.readouterr().out
    assert f'decoder cache {cache.folder}: hidden.npy truncated' in out
    prior = random_prior(3)
    assert_same(
        Rescorer(model, again).predict(prior),
        Rescorer(model, memory).predict(prior))


@pytest.fixture(scope='module')
def two_checkpoints(tmp_path_factory):
    """Two tiny CaliDINO checkpoints with different weights."""
    init_default_scope('mmdet')
    out = tmp_path_factory.mktemp('ckpts')
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = MODELS.build(get_config(CALI.split('configs/')[1]).model)
        model.init_weights()
        paths.append(str(out / f'cali{seed}.pth'))
        save_checkpoint(dict(state_dict=model.state_dict()), paths[-1])
    return paths


@pytest.mark.slow  # makes decoder caches several times
def test_eval_setups_share_a_cache_dir_without_mixing(two_checkpoints,
                                                      tmp_path, monkeypatch):
    from mmcalidet.evaluation import EvalSetup
    monkeypatch.chdir(PROJECT_ROOT)
    ckpt_a, ckpt_b = two_checkpoints
    cache_dir = str(tmp_path / 'caches')
    a = EvalSetup(CALI, ckpt_a, cache_dir=cache_dir, **SMALL)
    b = EvalSetup(CALI, ckpt_b, cache_dir=cache_dir, **SMALL)
    fa = a.info['decoder_caches']['model']
    fb = b.info['decoder_caches']['model']
    assert fa['folder'] != fb['folder']
    assert not fa['reused'] and not fb['reused']
    assert sorted(os.listdir(cache_dir)) == sorted(
        osp.basename(f['folder']) for f in (fa, fb))
    preds_a = a.methods[0].rescorer.predict()
    preds_b = b.methods[0].rescorer.predict()
    assert any(not torch.equal(x.bboxes, y.bboxes)
               for x, y in zip(preds_a, preds_b))
    # A again: its own folder, reused without running the trunk
    no_trunk(monkeypatch)
    a2 = EvalSetup(CALI, ckpt_a, cache_dir=cache_dir, **SMALL)
    assert a2.info['decoder_caches']['model'] == dict(fa, reused=True)
    assert_same(a2.methods[0].rescorer.predict(), preds_a)
    # other test images (another batch size): another folder
    with pytest.raises(AssertionError, match='must be reused'):
        EvalSetup(
            CALI, ckpt_a, cache_dir=cache_dir, **dict(SMALL, batch_size=1))


@pytest.mark.slow
def test_eval_tool_runs_reuse_the_cache_dir(two_checkpoints, tmp_path,
                                            monkeypatch, capsys, run_tool):
    monkeypatch.chdir(PROJECT_ROOT)
    ckpt_a, _ = two_checkpoints
    main = runpy.run_path(
        osp.join(PROJECT_ROOT, 'tools', 'analysis_tools', 'eval_priors.py'),
        run_name='tool')['main']
    cache_dir = str(tmp_path / 'caches')
    args = [
        CALI, ckpt_a, '--cache-dir', cache_dir, '--priors', 'E0', 'E_t',
        '--max-images', '2', '--device', 'cpu', '--no-progress',
        '--cfg-options', 'test_dataloader.dataset.pipeline.1.scale=(96,96)'
    ]
    assert main(args + ['--out-dir', str(tmp_path / 'one')]) == 0
    first = capsys.readouterr().out
    assert ': made (2 images)' in first
    folder = first.split('decoder cache ')[1].split(':')[0]
    # another process: the folder is reused, the table the same
    second = run_tool('tools/analysis_tools/eval_priors.py', *args,
                      '--out-dir', str(tmp_path / 'two'))
    assert second.returncode == 0, second.stderr
    assert f'decoder cache {folder}: reused (2 images)' in second.stdout
    rows = []
    for name in ('one', 'two'):
        with open(tmp_path / name / 'priors.json') as f:
            rows.append([(r['prior'], r['AP']) for r in json.load(f)['rows']])
    assert rows[0] == rows[1]


@pytest.mark.slow  # makes decoder caches several times
def test_one_cache_serves_a_baseline_only_with_the_same_test_inputs(tmp_path):
    """A CaliDINO calibrated on a DINO's outputs shares its decoder cache
    with that DINO, but not when the baseline's config tests on other
    inputs (a resize without keeping the aspect ratio): ``shares_trunk``
    compared weights only and scored the baseline on the CaliDINO's
    inputs."""
    from mmcalidet.evaluation import EvalSetup
    from testing import build_detector
    dino = build_detector('calidet/dino_tiny_coco-mini.py', seed=0)
    dino_file = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    cali = build_detector('calidet/calidet_dino_tiny_coco-mini.py', seed=1)
    missing = cali.load_state_dict(dino.state_dict(), strict=False)
    assert not missing.unexpected_keys
    cali_file = str(tmp_path / 'cali.pth')
    save_checkpoint(dict(state_dict=cali.state_dict()), cali_file)
    dino_config = osp.join(PROJECT_ROOT, 'configs', 'calidet',
                           'dino_tiny_coco-mini.py')
    other_inputs = str(tmp_path / 'dino_stretched.py')
    with open(other_inputs, 'w') as f:
        f.write(f"_base_ = '{dino_config}'\n"
                'test_dataloader = dict(dataset=dict(pipeline=[\n'
                "    dict(type='LoadImageFromFile'),\n"
                "    dict(type='Resize', scale=(96, 96), keep_ratio=False),\n"
                "    dict(type='LoadAnnotations', with_bbox=True),\n"
                "    dict(type='PackDetInputs', meta_keys=('img_id', "
                "'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]))\n")
    rows = {}
    for name, config in (('same', dino_config), ('other', other_inputs)):
        setup = EvalSetup(
            CALI,
            cali_file,
            baseline_config=config,
            baseline_checkpoint=dino_file,
            posthoc=[],
            **SMALL)
        rows[name] = setup
    assert rows['same'].info['shared_cache'] is True
    assert rows['other'].info['shared_cache'] is False
    # the stretched images are other inputs: the baseline's own outputs
    same_hidden = rows['same'].methods[-1].rescorer.cache.get([0])[0]
    other_hidden = rows['other'].methods[-1].rescorer.cache.get([0])[0]
    assert not torch.equal(same_hidden, other_hidden)


def test_a_shared_classifier_rescores_as_the_full_forward():
    """DAB-DETR's decoder layers share one classifier: the decoder head
    kind's layer logits read it (the re-scorer named a per-layer branch
    list before the head-kind adapters and failed on it)."""
    model, loader = tiny(
        'calidet/calidet_dab-detr_tiny_coco-mini.py', images=2)
    with torch.no_grad():
        for p in model.bbox_head.califormer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    cache = cache_hidden_states(model, loader, progress=False)
    rescorer = Rescorer(model, cache)
    prior = random_prior(2)
    model.set_prior(prior)
    assert_same(rescorer.predict(prior), full_forward(model, loader))
    a, b = rescorer.predict(prior), rescorer.predict(flat_prior(K))
    assert any(not torch.equal(x.scores, y.scores) for x, y in zip(a, b))
