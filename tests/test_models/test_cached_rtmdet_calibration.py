# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on a CaliRTMDet's cached locations: the dense
cache's arrays and their validation, the cached loss against the head's
loss on images, V' = 0 as the baseline, the gradients, the config and a
short run of tools/train.py."""
import copy
import json
import os.path as osp
import re

import numpy as np
import pytest
import torch
from mmdet.models.dense_heads import RTMDetSepBNHead
from mmengine.runner import save_checkpoint

from mmcalidet.datasets import DecoderCacheDataset
from mmcalidet.decoder_cache import (CacheError, DecoderCache,
                                     DecoderCacheWriter, fill_dense_cache)
from mmcalidet.decoder_cache.dense_targets import recording
from mmcalidet.models.detectors import CachedCalibrationMixin, CaliRTMDet
from mmcalidet.models.head_kinds import DENSE
from testing import (PROJECT_ROOT, build_detector, damage_cache_file,
                     data_root, demo_batch, get_config, random_prior, run_tool)

CONFIG = 'calidet/calidet_rtmdet_tiny_coco-mini_cached.py'
BASELINE = 'calidet/rtmdet_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ), (0, 5, 7))
#: a 64 px image has 8 x 8 + 4 x 4 + 2 x 2 locations
ALL = 84


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


@pytest.fixture(scope='module')
def baseline():
    return build_detector(BASELINE, seed=1).eval()


@pytest.fixture
def answering(model):
    """The model with V' != 0 and classification towers whose features
    are not near 0, restored after."""
    head = model.bbox_head
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*head.califormer.parameters(), *head.cls_convs.parameters()]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None
    model.set_prior(None)


def dense_cache(detector,
                labels=LABELS,
                num_locations=40,
                target=None,
                batch_size=3):
    batches = [
        demo_batch(labels[s:s + batch_size], size=64, seed=s)
        for s in range(0, len(labels), batch_size)
    ]
    writer = DecoderCacheWriter(target, fingerprint=dict(test=1))
    return fill_dense_cache(
        detector, batches, writer, num_locations, seed=0, progress=False)


def batch_inputs(cache, index=None):
    index = list(range(len(cache))) if index is None else index
    return dict(
        hidden_states=torch.as_tensor(cache.hidden[index]).transpose(0, 1),
        bbox_preds=torch.as_tensor(cache.boxes[index]).transpose(0, 1),
        targets=torch.as_tensor(cache.targets[index]))


def test_the_cache_holds_positives_and_weighted_negatives(baseline):
    cache = dense_cache(baseline)
    d = baseline.bbox_head.feat_channels
    assert cache.meta['head'] == 'dense' and cache.meta['num_levels'] == 3
    assert cache.hidden.shape == (3, 1, 40, d)
    assert cache.boxes.shape == (3, 1, 40, 4)
    assert cache.targets.shape == (3, 40, 4)
    level, label, score, weight = np.moveaxis(cache.targets, -1, 0)
    pos = (label < 80) & (weight > 0)
    neg = (label == 80) & (weight > 0)
    for i, labels in enumerate(LABELS):
        assert set(label[i][pos[i]]) <= set(labels) and pos[i].any()
        # 40 locations of 84: the negatives are sampled, weighted by
        # negatives / sampled, so the weights sum to the 84 locations
        assert pos[i].sum() + neg[i].sum() == 40
        np.testing.assert_allclose(weight[i].sum(), ALL, rtol=1e-5)
    assert (score[~pos] == 0).all()
    assert set(np.unique(level)) <= {0, 1, 2}


def test_the_store_refuses_a_torn_missing_or_impossible_targets_file(
        baseline, tmp_path):
    folder = str(tmp_path / 'cache')
    made = dense_cache(baseline, target=folder)
    opened = DecoderCache.open(folder)
    np.testing.assert_array_equal(opened.targets, made.targets)
    item = DecoderCacheDataset(folder)[1]
    assert item['inputs']['targets'].shape == (40, 4)
    damage_cache_file(folder, 'targets.npy', 'truncate')
    with pytest.raises(CacheError, match='targets.npy'):
        DecoderCache.open(folder)
    damage_cache_file(folder, 'targets.npy', 'delete')
    with pytest.raises(CacheError, match='targets.npy'):
        DecoderCache.open(folder)
    bad = np.array(made.targets)
    bad[0, 0, 1] = 81  # no such label
    np.save(osp.join(folder, 'targets.npy'), bad)
    with pytest.raises(CacheError, match='targets.npy: a label'):
        DecoderCache.open(folder)


def test_a_decoder_cache_of_format_2_still_opens(tmp_path):
    folder = str(tmp_path / 'detr')
    writer = DecoderCacheWriter(folder, fingerprint=dict(test=1))
    samples = demo_batch(((1, ), ), size=32)['data_samples']
    writer.add(torch.zeros(2, 1, 3, 8), torch.rand(2, 1, 3, 4), samples, 0)
    assert writer.commit().targets is None
    path = osp.join(folder, 'meta.json')
    with open(path) as f:
        meta = json.load(f)
    meta['format'] = 2
    del meta['head']
    with open(path, 'w') as f:
        json.dump(meta, f)
    assert DecoderCache.open(folder).hidden.shape == (1, 2, 3, 8)


def test_cached_loss_is_the_head_loss_on_all_locations(answering):
    """Every location cached (no sampling): the cached QFL and LoMa equal
    the head's own losses on the image under the same prior."""
    model = answering.eval()
    head = model.bbox_head
    with torch.no_grad():  # 16 x 16 px boxes: quality targets sum past 1
        for reg, stride in zip(head.rtm_reg, (8, 16, 32)):
            reg.weight.zero_()
            reg.bias.fill_(
                float(np.log(8 / stride)) if head.exp_on_reg else 8 / stride)
    prior = random_prior(3)
    model.set_prior(prior)
    labels = LABELS[2:]
    cache = dense_cache(model, labels=labels, num_locations=ALL + 6)
    assert set(np.unique(cache.targets[..., 3])) == {0.0, 1.0}
    # RTMDet divides by the sum of the quality targets (at least 1)
    assert cache.targets[..., 2].sum() > 1.5
    data = model.data_preprocessor(demo_batch(labels, size=64), False)
    samples = data['data_samples']
    priors = model.prior[None]
    cali = model.deployment_cali_vectors()
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        with head.calibrated(cali, priors):
            expected = head.loss(feats, samples)
        inputs = batch_inputs(cache)
        got = DENSE.cached_losses(
            head, inputs, samples, cali, priors, train_cls=False)
        # the model's loss, V' from each sample's prior
        samples[0].prior = model.prior.clone()
        by_model = model.loss(batch_inputs(cache), samples)
    assert len(expected['loss_cls']) == 3  # one per level, summed
    torch.testing.assert_close(got['loss_cls'], sum(expected['loss_cls']))
    torch.testing.assert_close(got['loss_loma'], expected['loss_loma'])
    assert expected['loss_loma'] != 0
    for key in ('loss_cls', 'loss_loma'):
        torch.testing.assert_close(by_model[key], got[key])


def test_zero_v_prime_gives_the_baselines_logits(model, baseline):
    """The calibrator starts as the baseline: with the zero-initialised
    CaliFormer, the cached logits under any prior are the plain RTMDet's
    at those locations."""
    calibrator = copy.deepcopy(model)
    calibrator.load_state_dict(baseline.state_dict(), strict=False)
    head, plain = calibrator.bbox_head, baseline.bbox_head
    cache = dense_cache(baseline, labels=LABELS[:1], num_locations=ALL)
    data = baseline.data_preprocessor(demo_batch(LABELS[:1], size=64), False)
    with torch.no_grad(), recording(plain) as (calls, _):
        feats = baseline.extract_feat(data['inputs'])
        scores, _ = RTMDetSepBNHead.forward(plain, feats)
        scores = torch.cat([s.flatten(2) for s in scores], 2)[0].t()
        flat = torch.cat([f.flatten(2) for f, _ in calls], 2)[0].t()
        inputs = batch_inputs(cache)
        prior = torch.as_tensor(random_prior(4), dtype=torch.float32)
        cali = head.get_cali_vectors(prior)
        got = DENSE.calibrated_logits(head, inputs['hidden_states'][0],
                                      inputs['targets'][..., 0], cali)[0]
    assert torch.equal(cali, torch.zeros_like(cali))
    # all 84 locations, in the cache's order (positives first): each
    # cached feature is one of the map's, its logits the head's there
    same = (inputs['hidden_states'][0, 0, :, None] == flat[None]).all(-1)
    assert (same.sum(1) == 1).all()
    where = same.float().argmax(1)
    assert sorted(where.tolist()) == list(range(ALL))
    torch.testing.assert_close(got, scores[where])


@pytest.mark.parametrize('train_cls', [False, True])
def test_gradients_reach_the_calibrator_only(baseline, train_cls):
    model = build_detector(CONFIG, seed=0, cache_train_cls_branches=train_cls)
    cache = dense_cache(baseline)
    samples = copy.deepcopy(cache.data_samples)
    losses = model.loss(batch_inputs(cache), samples)
    assert set(losses) == {'loss_cls', 'loss_loma'}
    sum(losses.values()).backward()
    with_grad = {
        '.'.join(name.split('.')[:2])
        for name, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    expected = {'bbox_head.califormer'}
    if train_cls:
        expected.add('bbox_head.rtm_cls')
    assert with_grad == expected
    assert set(model.calibrator_modules()) == {
        'bbox_head.califormer'
    } | ({f'bbox_head.rtm_cls.{i}'
          for i in range(3)} if train_cls else set())


def test_cached_batches_through_the_preprocessor(model, baseline):
    cache = dense_cache(baseline)
    dataset_items = [
        dict(
            inputs=dict(
                hidden_states=torch.as_tensor(cache.hidden[i]),
                bbox_preds=torch.as_tensor(cache.boxes[i]),
                targets=cache.targets_of(i)),
            data_samples=cache.data_sample(i)) for i in range(3)
    ]
    batch = dict(
        inputs={
            k: [it['inputs'][k] for it in dataset_items]
            for k in ('hidden_states', 'bbox_preds', 'targets')
        },
        data_samples=[it['data_samples'] for it in dataset_items])
    model.train()
    data = model.data_preprocessor(batch, True)
    assert torch.equal(data['inputs']['targets'],
                       torch.as_tensor(cache.targets))
    assert all(ds.prior.shape == (80, 80) for ds in data['data_samples'])
    losses = model.loss(data['inputs'], data['data_samples'])
    assert torch.isfinite(sum(losses.values()))
    # a decoder cache's batch is refused by the dense head
    decoder = dict(data['inputs'])
    del decoder['targets']
    with pytest.raises(TypeError, match='decoder cache'):
        model.loss(decoder, data['data_samples'])


def test_the_calibrator_config(model):
    cfg = get_config(CONFIG)
    parent = get_config('calidet/calidet_rtmdet_tiny_coco-mini.py')
    assert cfg.model.type == 'CachedCalibration'
    assert cfg.model.detector == parent.model.type == 'CaliRTMDet'
    assert isinstance(model, CaliRTMDet)
    assert isinstance(model, CachedCalibrationMixin)
    assert cfg.model.data_preprocessor.type == 'DecoderCachePreprocessor'
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == 'DecoderCacheDataset'
    assert dataset.source.config.endswith(BASELINE)
    assert dataset.source.num_locations == 512
    assert cfg.optim_wrapper.constructor == \
        'CalibratorOptimWrapperConstructor'
    assert cfg.optim_wrapper.optimizer.lr == 2e-4
    head = copy.deepcopy(cfg.model.bbox_head)
    assert head.califormer.pop('zero_init_output') is True
    parent_head = copy.deepcopy(parent.model.bbox_head)
    parent_head.califormer.pop('zero_init_output', None)
    assert head == parent_head


@pytest.mark.slow
def test_tools_train_runs_the_cached_config(tmp_path):
    """tools/train.py makes the dense cache from the baseline checkpoint
    and updates the CaliFormer alone for 3 iterations."""
    baseline = build_detector(BASELINE, seed=0)
    ckpt = str(tmp_path / 'rtmdet.pth')
    save_checkpoint(dict(state_dict=baseline.state_dict()), ckpt)
    proc = run_tool(
        'tools/train.py',
        'configs/' + CONFIG,
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        f'load_from={ckpt}',
        f'train_dataloader.dataset.cache_dir={tmp_path}/cache',
        'train_dataloader.dataset.source.indices=[0,1,2,3]',
        'train_dataloader.dataset.source.progress=False',
        'train_cfg.max_iters=3',
        'train_cfg.val_interval=1000',
        'train_cfg.val_begin=1000',
        'default_hooks.checkpoint.interval=3',
        'default_hooks.logger.interval=1',
        'randomness.seed=0',
        threads=1)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    assert re.findall(r'Iter\(train\) \[\s*(\d+)/', output)[-1] == '3'
    assert ' loss_cls: ' in output and ' loss_loma: ' in output
    assert DecoderCache.open(str(tmp_path / 'cache')).meta['head'] == 'dense'
    state = torch.load(
        osp.join(tmp_path, 'iter_3.pth'), weights_only=False)['state_dict']
    for key, value in baseline.state_dict().items():
        assert torch.equal(state[key], value), key


@pytest.mark.slow
def test_the_cache_tool_makes_and_checks_a_dense_cache(tmp_path, capsys,
                                                       monkeypatch):
    import runpy
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    ckpt = str(tmp_path / 'rtmdet.pth')
    save_checkpoint(
        dict(state_dict=build_detector(BASELINE, seed=0).state_dict()), ckpt)
    main = runpy.run_path(
        osp.join(PROJECT_ROOT,
                 'tools/analysis_tools/cache_decoder_outputs.py'),
        run_name='tool')['main']
    out = str(tmp_path / 'cache')
    args = [
        osp.join(PROJECT_ROOT, 'configs', BASELINE), ckpt, '--out', out,
        '--num-images', '2', '--num-locations', '300', '--no-progress'
    ]
    assert main(args) == 0
    assert 'cached 2 entries x 300 locations of a dense head' in \
        capsys.readouterr().out
    assert main(args) == 0 and 'is up to date' in capsys.readouterr().out
    assert main(['--check', out]) == 0
    assert 'valid: 2 entries x 300 locations' in capsys.readouterr().out
