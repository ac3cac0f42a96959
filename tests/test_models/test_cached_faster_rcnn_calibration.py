# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on a CaliFasterRCNN's cached RoIs: the box-head
cache's arrays and their validation, the cached loss against the box
head's loss on images for the same sampled RoIs, V' = 0 as the baseline,
the gradients, the config and a short run of tools/train.py."""
import copy
import json
import os.path as osp
import re

import numpy as np
import pytest
import torch
from mmdet.models.detectors import TwoStageDetector
from mmengine.runner import save_checkpoint

from mmcalidet.datasets import DecoderCacheDataset
from mmcalidet.decoder_cache import (CacheError, DecoderCache,
                                     DecoderCacheWriter, fill_roi_cache,
                                     is_roi_model)
from mmcalidet.decoder_cache.roi_targets import recording_rois
from mmcalidet.models.detectors import CachedCalibrationMixin, CaliFasterRCNN
from mmcalidet.models.head_kinds import ROI
from testing import (PROJECT_ROOT, build_detector, damage_cache_file,
                     data_root, demo_batch, get_config, random_prior, run_tool)

CONFIG = 'calidet/calidet_faster-rcnn_tiny_coco-mini_cached.py'
BASELINE = 'calidet/faster-rcnn_tiny_coco-mini.py'
LABELS = ((1, 2), (3, ), (0, 5, 7))
K = 80
#: the sampler's RoIs per image in the tiny configs
NUM = 128
HEAD = 'roi_head.bbox_head'


@pytest.fixture(scope='module')
def model():
    return build_detector(CONFIG, seed=0)


@pytest.fixture(scope='module')
def baseline():
    return build_detector(BASELINE, seed=1).eval()


@pytest.fixture
def answering(model):
    """The model with V' != 0 and a classifier bias (mmdet's is 0),
    restored after."""
    head = model.roi_head.bbox_head
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [*head.califormer.parameters(), head.fc_cls.bias]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None
    model.set_prior(None)


def roi_cache(detector, labels=LABELS, num_rois=None, target=None, seed=0):
    """The RoI cache of one batch of ``labels``, the sampler seeded."""
    torch.manual_seed(seed)
    writer = DecoderCacheWriter(target, fingerprint=dict(test=1))
    return fill_roi_cache(
        detector, [demo_batch(labels, size=64)],
        writer,
        num_rois,
        progress=False)


def image_losses(detector, labels, seed=0, **calibration):
    """mmdet's two-stage losses on the images of ``labels`` (the sampler
    seeded as :func:`roi_cache`), what the box head's loss saw."""
    data = detector.data_preprocessor(demo_batch(labels, size=64), False)
    head = detector.roi_head.bbox_head
    torch.manual_seed(seed)
    with torch.no_grad(), recording_rois(head) as record:
        if calibration:
            with head.calibrated(**calibration):
                losses = TwoStageDetector.loss(detector, data['inputs'],
                                               data['data_samples'])
        else:
            losses = TwoStageDetector.loss(detector, data['inputs'],
                                           data['data_samples'])
    return losses, record, data['data_samples']


def batch_inputs(cache, index=None):
    index = list(range(len(cache))) if index is None else index
    return dict(
        hidden_states=torch.as_tensor(cache.hidden[index]).transpose(0, 1),
        bbox_preds=torch.as_tensor(cache.boxes[index]).transpose(0, 1),
        targets=torch.as_tensor(cache.targets[index]))


def test_the_cache_holds_the_sampled_rois(baseline):
    assert is_roi_model(baseline)
    cache = roi_cache(baseline, num_rois=NUM + 8)
    d = baseline.roi_head.bbox_head.fc_cls.in_features
    assert cache.meta['head'] == 'roi' and cache.meta['num_levels'] == 1
    assert cache.meta['num_classes'] == K
    assert cache.hidden.shape == (3, 1, NUM + 8, d)
    assert cache.boxes.shape == (3, 1, NUM + 8, 4)
    assert cache.targets.shape == (3, NUM + 8, 4)
    level, label, positive, weight = np.moveaxis(cache.targets, -1, 0)
    assert (level == 0).all()
    for i, labels in enumerate(LABELS):
        # the sampler's 128 RoIs (the ground truth among the positives),
        # then 8 padding rows of weight 0, background and zero features
        assert (weight[i, :NUM] == 1).all() and (weight[i, NUM:] == 0).all()
        assert (label[i, NUM:] == K).all()
        assert not cache.hidden[i, 0, NUM:].any()
        pos = label[i] < K
        assert set(label[i][pos]) == set(labels)
        np.testing.assert_array_equal(positive[i], pos)
    assert ((cache.boxes >= 0) & (cache.boxes <= 1.5)).all()


def test_the_store_refuses_bad_targets_of_a_roi_cache(baseline, tmp_path):
    folder = str(tmp_path / 'cache')
    made = roi_cache(baseline, labels=LABELS[:2], target=folder)
    opened = DecoderCache.open(folder)
    assert opened.meta['head'] == 'roi'
    np.testing.assert_array_equal(opened.targets, made.targets)
    np.testing.assert_array_equal(opened.hidden, made.hidden)
    item = DecoderCacheDataset(folder)[1]
    assert item['inputs']['targets'].shape == (NUM, 4)
    good = np.array(made.targets)
    for column, value, problem in ((0, 1, 'a level'), (1, K + 1, 'a label'),
                                   (2, 2, 'outside'), (3, -1, 'negative'),
                                   (3, np.nan, 'not finite')):
        bad = good.copy()
        bad[1, 3, column] = value
        np.save(osp.join(folder, 'targets.npy'), bad)
        with pytest.raises(CacheError, match=f'targets.npy: .*{problem}'):
            DecoderCache.open(folder)
    damage_cache_file(folder, 'targets.npy', 'delete')
    with pytest.raises(CacheError, match='targets.npy'):
        DecoderCache.open(folder)


def test_a_roi_cache_needs_its_counts_and_a_known_kind(baseline, tmp_path):
    folder = str(tmp_path / 'cache')
    roi_cache(baseline, labels=LABELS[:1], target=folder)
    path = osp.join(folder, 'meta.json')
    with open(path) as f:
        meta = json.load(f)
    for change, problem in ((dict(num_classes=None), 'num_classes'),
                            (dict(head='rois'), 'head')):
        with open(path, 'w') as f:
            json.dump({**meta, **change}, f)
        with pytest.raises(CacheError, match=problem):
            DecoderCache.open(folder)
    writer = DecoderCacheWriter()
    samples = demo_batch(((1, ), ), size=32)['data_samples']
    with pytest.raises(ValueError, match='rois'):
        writer.add(
            torch.zeros(1, 1, 3, 8),
            torch.rand(1, 1, 3, 4),
            samples,
            0,
            targets=torch.zeros(1, 3, 4),
            head='rois')


def test_more_rois_than_the_cache_holds_are_refused(baseline):
    with pytest.raises(ValueError, match='num_locations=100'):
        roi_cache(baseline, labels=LABELS[:1], num_rois=100)


def test_cached_loss_is_the_box_head_loss_on_the_same_rois(answering):
    """The sampler seeded alike: the cache holds the RoIs the box head's
    loss on the images sampled, and the cached cross-entropy (over mmdet's
    avg_factor), accuracy and LoMa equal the head's under the same
    prior."""
    model = answering.eval()
    head = model.roi_head.bbox_head
    model.set_prior(random_prior(3))
    labels = (LABELS[0], LABELS[2])
    cache = roi_cache(model, labels=labels, num_rois=NUM + 4, seed=5)
    priors = model.prior[None].expand(2, -1, -1)
    cali = model.deployment_cali_vectors()
    expected, record, samples = image_losses(
        model, labels, seed=5, cali_vectors=cali, priors=priors)
    # the same RoIs, in the same order
    rois = record['rois']
    for i in range(2):
        mine = rois[rois[:, 0] == i, 1:]
        assert len(mine) == NUM
        h, w = samples[i].metainfo['img_shape']
        cx = (mine[:, 0] + mine[:, 2]) / 2 / w
        torch.testing.assert_close(
            torch.as_tensor(cache.boxes[i, 0, :NUM, 0]), cx)
    inputs = batch_inputs(cache)
    with torch.no_grad():
        got = ROI.cached_losses(
            head, inputs, samples, cali, priors, train_cls=False)
        # the model's loss, per-image V' of each sample's prior
        for ds in samples:
            ds.prior = model.prior.clone()
        by_model = model.loss(inputs, samples)
    assert expected['loss_loma'] != 0
    for key in ('loss_cls', 'acc', 'loss_loma'):
        torch.testing.assert_close(got[key], expected[key], msg=key)
        torch.testing.assert_close(by_model[key], got[key], msg=key)


def test_zero_v_prime_gives_the_baselines_logits(model, baseline):
    """The calibrator starts as the baseline: with the zero-initialised
    CaliFormer, the cached logits under any prior are the plain Faster
    R-CNN's logits of the sampled RoIs."""
    baseline = copy.deepcopy(baseline)
    with torch.no_grad():  # mmdet's bias is 0
        baseline.roi_head.bbox_head.fc_cls.bias.normal_(
            generator=torch.Generator().manual_seed(0))
    calibrator = copy.deepcopy(model)
    calibrator.load_state_dict(baseline.state_dict(), strict=False)
    head = calibrator.roi_head.bbox_head
    cache = roi_cache(baseline, labels=LABELS[:1], seed=2)
    _, record, _ = image_losses(baseline, LABELS[:1], seed=2)
    prior = torch.as_tensor(random_prior(4), dtype=torch.float32)
    with torch.no_grad():
        cali = head.get_cali_vectors(prior)
        got = ROI.calibrated_logits(
            head,
            torch.as_tensor(cache.hidden[:, 0]),
            torch.stack([cali]),
        )[0]
    assert torch.equal(cali, torch.zeros_like(cali))
    torch.testing.assert_close(got, record['cls_score'])


@pytest.mark.parametrize('train_cls', [False, True])
def test_gradients_reach_the_calibrator_only(baseline, train_cls):
    model = build_detector(CONFIG, seed=0, cache_train_cls_branches=train_cls)
    cache = roi_cache(baseline, labels=LABELS[:2])
    samples = copy.deepcopy(cache.data_samples)
    losses = model.loss(batch_inputs(cache), samples)
    assert set(losses) == {'loss_cls', 'acc', 'loss_loma'}
    (losses['loss_cls'] + losses['loss_loma']).backward()
    with_grad = {
        '.'.join(name.split('.')[:3])
        for name, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    expected = {f'{HEAD}.califormer'}
    if train_cls:
        expected.add(f'{HEAD}.fc_cls')
    assert with_grad == expected
    assert set(model.calibrator_modules()) == expected


def test_cached_batches_through_the_preprocessor(model, baseline):
    cache = roi_cache(baseline)
    items = [
        dict(
            inputs=dict(
                hidden_states=torch.as_tensor(cache.hidden[i]),
                bbox_preds=torch.as_tensor(cache.boxes[i]),
                targets=cache.targets_of(i)),
            data_samples=cache.data_sample(i)) for i in range(3)
    ]
    batch = dict(
        inputs={
            k: [it['inputs'][k] for it in items]
            for k in ('hidden_states', 'bbox_preds', 'targets')
        },
        data_samples=[it['data_samples'] for it in items])
    model.train()
    data = model.data_preprocessor(batch, True)
    assert torch.equal(data['inputs']['targets'],
                       torch.as_tensor(cache.targets))
    assert all(ds.prior.shape == (K, K) for ds in data['data_samples'])
    losses = model.loss(data['inputs'], data['data_samples'])
    assert torch.isfinite(losses['loss_cls'] + losses['loss_loma'])
    # a decoder cache's batch, or features of another width, are refused
    decoder = dict(data['inputs'])
    del decoder['targets']
    with pytest.raises(TypeError, match='decoder cache'):
        model.loss(decoder, data['data_samples'])
    narrow = dict(data['inputs'])
    narrow['hidden_states'] = narrow['hidden_states'][..., :96]
    with pytest.raises(TypeError, match='96-wide'):
        model.loss(narrow, data['data_samples'])


def test_the_calibrator_config(model):
    cfg = get_config(CONFIG)
    parent = get_config('calidet/calidet_faster-rcnn_tiny_coco-mini.py')
    plain = get_config(BASELINE)
    assert cfg.model.type == 'CachedCalibration'
    assert cfg.model.detector == parent.model.type == 'CaliFasterRCNN'
    assert isinstance(model, CaliFasterRCNN)
    assert isinstance(model, CachedCalibrationMixin)
    assert cfg.model.data_preprocessor.type == 'DecoderCachePreprocessor'
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == 'DecoderCacheDataset'
    assert dataset.source.config.endswith(BASELINE)
    assert dataset.source.num_locations == \
        plain.model.train_cfg.rcnn.sampler.num == NUM
    assert cfg.optim_wrapper.constructor == \
        'CalibratorOptimWrapperConstructor'
    assert cfg.optim_wrapper.optimizer.lr == 2e-4
    assert cfg.model.roi_head == parent.model.roi_head
    assert cfg.model.roi_head.bbox_head.califormer.zero_init_output
    # the baseline is the CaliDet model without its CaliDet parts
    for key in ('backbone', 'neck', 'rpn_head', 'train_cfg', 'test_cfg'):
        assert cfg.model[key] == plain.model[key], key


@pytest.mark.slow
def test_tools_train_runs_the_cached_config(tmp_path):
    """tools/train.py makes the RoI cache from the baseline checkpoint and
    updates the CaliFormer alone for 3 iterations."""
    baseline = build_detector(BASELINE, seed=0)
    ckpt = str(tmp_path / 'faster_rcnn.pth')
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
    assert DecoderCache.open(str(tmp_path / 'cache')).meta['head'] == 'roi'
    state = torch.load(
        osp.join(tmp_path, 'iter_3.pth'), weights_only=False)['state_dict']
    for key, value in baseline.state_dict().items():
        assert torch.equal(state[key], value), key


@pytest.mark.slow
def test_the_cache_tool_makes_and_checks_a_roi_cache(tmp_path, capsys,
                                                     monkeypatch):
    import runpy
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    ckpt = str(tmp_path / 'faster_rcnn.pth')
    save_checkpoint(
        dict(state_dict=build_detector(BASELINE, seed=0).state_dict()), ckpt)
    main = runpy.run_path(
        osp.join(PROJECT_ROOT,
                 'tools/analysis_tools/cache_decoder_outputs.py'),
        run_name='tool')['main']
    out = str(tmp_path / 'cache')
    args = [
        osp.join(PROJECT_ROOT, 'configs', BASELINE), ckpt, '--out', out,
        '--num-images', '2', '--no-progress'
    ]
    assert main(args) == 0
    assert 'cached 2 entries x 128 RoIs of a box head' in \
        capsys.readouterr().out
    assert main(args) == 0 and 'is up to date' in capsys.readouterr().out
    assert main(['--check', out]) == 0
    assert 'valid: 2 entries x 128 RoIs' in capsys.readouterr().out
