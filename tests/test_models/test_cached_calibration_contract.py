# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on the cached locations of a one-stage head
(CaliRTMDet, CaliFCOS) and the cached RoIs of a box head (CaliFasterRCNN),
one contract for every family (testing/cached_families.py): the cache's
arrays and their validation, the cached loss against the head's loss on
images, V' = 0 as the baseline, the gradients, the preprocessor, the
config, a short run of tools/train.py and the cache tool. The model and
the baseline are built once per family. The box head's own contract (the
sampled RoIs) closes the file."""
import copy
import json
import os.path as osp
import re
import runpy

import numpy as np
import pytest
import torch
from mmdet.models import dense_heads
from mmdet.models.detectors import TwoStageDetector
from mmengine.runner import save_checkpoint

from mmcalidet.datasets import DecoderCacheDataset
from mmcalidet.decoder_cache import (CacheError, DecoderCache,
                                     DecoderCacheWriter, is_roi_model)
from mmcalidet.decoder_cache.roi_targets import recording_rois
from mmcalidet.models import detectors
from mmcalidet.models.head_kinds import DENSE, ROI
from mmcalidet.models.head_kinds.dense import location_features
from testing import (PROJECT_ROOT, build_detector, damage_cache_file,
                     data_root, demo_batch, get_config, random_prior, run_tool)
from testing.cached_families import (FAMILIES, LABELS, batch_inputs,
                                     calibrated_head, dataset_batch,
                                     small_cache)

K = 80
DENSE_FAMILIES = ('rtmdet', 'fcos')
#: the families whose tools/train.py run and cache tool are run (slow)
TOOL_FAMILIES = ('rtmdet', 'faster_rcnn')


def families(*names):
    """Parametrize a test over some families (all without names)."""
    return pytest.mark.parametrize(
        'family', names or tuple(FAMILIES), indirect=True)


@pytest.fixture(scope='module')
def family(request):
    return FAMILIES[request.param]


@pytest.fixture(scope='module')
def model(family):
    return build_detector(family.config, seed=0)


@pytest.fixture(scope='module')
def baseline(family):
    return build_detector(family.baseline, seed=1).eval()


@pytest.fixture(scope='module')
def cache(family, baseline):
    """The baseline's cache of the three demo images (read only)."""
    return small_cache(family, baseline)


@pytest.fixture(scope='module')
def checkpoint(family, baseline, tmp_path_factory):
    """The baseline's weights saved as a checkpoint."""
    path = str(tmp_path_factory.mktemp(family.name) / 'baseline.pth')
    save_checkpoint(dict(state_dict=baseline.state_dict()), path)
    return path


@pytest.fixture
def answering(family, model):
    """The model with V' != 0 and classification layers whose output is
    not near 0 (a dense head's towers; a box head's classifier bias,
    mmdet's is 0), restored after."""
    head = calibrated_head(model, family)
    state = copy.deepcopy(head.state_dict())
    gen = torch.Generator().manual_seed(1)
    changed = [head.fc_cls.bias] if family.kind == 'roi' else list(
        head.cls_convs.parameters())
    with torch.no_grad():
        for p in [*head.califormer.parameters(), *changed]:
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    yield model
    head.load_state_dict(state)
    model._cali_cache = None
    model.set_prior(None)


def feature_width(family, head):
    """The width of the features the family's head classifies."""
    if family.kind == 'roi':
        return head.fc_cls.in_features
    return head.feat_channels * family.kernel**2


@families(*DENSE_FAMILIES)
def test_the_cache_holds_positives_and_weighted_negatives(
        family, baseline, cache):
    made = cache
    n, all_ = family.num_levels, family.all_locations
    width = feature_width(family, baseline.bbox_head)
    assert made.meta['head'] == 'dense' and made.meta['num_levels'] == n
    assert made.hidden.shape == (3, 1, 40, width)
    assert made.boxes.shape == (3, 1, 40, 4)
    assert made.targets.shape == (3, 40, 4)
    level, label, score, weight = np.moveaxis(made.targets, -1, 0)
    pos = (label < K) & (weight > 0)
    neg = (label == K) & (weight > 0)
    for i, labels in enumerate(LABELS):
        assert set(label[i][pos[i]]) <= set(labels) and pos[i].any()
        # 40 locations of the image's: the negatives are sampled, weighted
        # by negatives / sampled, so the weights sum to all its locations
        assert pos[i].sum() + neg[i].sum() == 40
        np.testing.assert_allclose(weight[i].sum(), all_, rtol=1e-5)
    if family.name == 'rtmdet':  # soft IoU targets, 0 off the positives
        assert (score[~pos] == 0).all()
    assert set(np.unique(level)) <= set(range(n))


@families()
def test_the_store_refuses_torn_missing_or_impossible_targets(
        family, baseline, tmp_path):
    folder = str(tmp_path / 'cache')
    made = small_cache(family, baseline, labels=LABELS[:2], target=folder)
    opened = DecoderCache.open(folder)
    assert opened.meta['head'] == family.kind
    np.testing.assert_array_equal(opened.targets, made.targets)
    np.testing.assert_array_equal(opened.hidden, made.hidden)
    item = DecoderCacheDataset(folder)[1]
    num = 128 if family.kind == 'roi' else 40
    assert item['inputs']['targets'].shape == (num, 4)
    good = np.array(made.targets)
    problems = [(0, family.num_levels, 'a level is not an integer'),
                (1, K + 1, 'a label is not an integer'),
                (2, 2, r'a quality score is outside \[0, 1\]'),
                (3, -1, 'a loss weight is negative'),
                (3, np.nan, 'holds values that are not finite')]
    for column, value, problem in problems:
        bad = good.copy()
        bad[1, 3, column] = value
        np.save(osp.join(folder, 'targets.npy'), bad)
        with pytest.raises(CacheError, match=f'targets.npy: {problem}'):
            DecoderCache.open(folder)
    np.save(osp.join(folder, 'targets.npy'), good)
    assert DecoderCache.open(folder).meta['head'] == family.kind
    for how in ('truncate', 'delete'):
        damage_cache_file(folder, 'targets.npy', how)
        with pytest.raises(CacheError, match='targets.npy'):
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


@families(*DENSE_FAMILIES)
def test_cached_loss_is_the_head_loss_on_all_locations(family, answering):
    """Every location cached (no sampling): the cached classification
    loss and LoMa equal the head's own losses on the image under the same
    prior."""
    model = answering.eval()
    head = model.bbox_head
    if family.name == 'rtmdet':
        with torch.no_grad():  # 16 x 16 px boxes: quality targets past 1
            for reg, stride in zip(head.rtm_reg, (8, 16, 32)):
                size = 8 / stride
                reg.weight.zero_()
                reg.bias.fill_(
                    float(np.log(size)) if head.exp_on_reg else size)
    model.set_prior(random_prior(3))
    labels = LABELS[2:]
    made = small_cache(
        family, model, labels=labels, num_locations=family.all_locations + 6)
    if family.name == 'rtmdet':
        assert set(np.unique(made.targets[..., 3])) == {0.0, 1.0}
        # RTMDet divides by the sum of the quality targets (at least 1)
        assert made.targets[..., 2].sum() > 1.5
    data = model.data_preprocessor(demo_batch(labels, size=64), False)
    samples = data['data_samples']
    priors = model.prior[None]
    cali = model.deployment_cali_vectors()
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        with head.calibrated(cali, priors):
            expected = head.loss(feats, samples)
        got = DENSE.cached_losses(
            head, batch_inputs(made), samples, cali, priors, train_cls=False)
        # the model's loss, V' from each sample's prior
        samples[0].prior = model.prior.clone()
        by_model = model.loss(batch_inputs(made), samples)
    loss_cls = expected['loss_cls']
    if isinstance(loss_cls, (list, tuple)):  # one per level, summed
        assert len(loss_cls) == family.num_levels
        loss_cls = sum(loss_cls)
    torch.testing.assert_close(got['loss_cls'], loss_cls)
    torch.testing.assert_close(got['loss_loma'], expected['loss_loma'])
    assert expected['loss_loma'] != 0
    for key in ('loss_cls', 'loss_loma'):
        torch.testing.assert_close(by_model[key], got[key])


@families(*DENSE_FAMILIES)
def test_zero_v_prime_gives_the_baselines_logits(family, model, baseline):
    """The calibrator starts as the baseline: with the zero-initialised
    CaliFormer, the cached logits under any prior are the plain head's at
    those locations."""
    calibrator = copy.deepcopy(model)
    calibrator.load_state_dict(baseline.state_dict(), strict=False)
    head, plain = calibrator.bbox_head, baseline.bbox_head
    all_ = family.all_locations
    made = small_cache(family, baseline, labels=LABELS[:1], num_locations=all_)
    data = baseline.data_preprocessor(demo_batch(LABELS[:1], size=64), False)
    forward = getattr(dense_heads, family.plain_head).forward
    convs = getattr(plain, family.cls)
    conv = convs[0] if isinstance(convs, torch.nn.ModuleList) else convs
    assert tuple(conv.kernel_size) == (family.kernel, ) * 2
    with torch.no_grad(), DENSE.recording_calls(plain) as calls:
        scores = forward(plain, baseline.extract_feat(data['inputs']))[0]
        scores = torch.cat([s.flatten(2) for s in scores], 2)[0].t()
        flat = torch.cat([location_features(conv, x) for x, _ in calls], 1)[0]
        inputs = batch_inputs(made)
        cali = head.get_cali_vectors(
            torch.as_tensor(random_prior(4), dtype=torch.float32))
        got = DENSE.calibrated_logits(head, inputs['hidden_states'][0],
                                      inputs['targets'][..., 0], cali)[0]
    assert torch.equal(cali, torch.zeros_like(cali))
    # every location, in the cache's order (positives first): each cached
    # feature is one of the map's, its logits the head's there
    same = (inputs['hidden_states'][0, 0, :, None] == flat[None]).all(-1)
    where = same.float().argmax(1)
    if family.kernel == 1:
        assert (same.sum(1) == 1).all()
        assert sorted(where.tolist()) == list(range(all_))
    else:  # the 1 x 1 levels' windows are all padding but their centre
        assert (same.sum(1) >= 1).all()
    torch.testing.assert_close(got, scores[where], **family.logits_tol)


@families()
@pytest.mark.parametrize('train_cls', [False, True])
def test_gradients_reach_the_calibrator_only(family, model, cache, train_cls):
    if train_cls:
        model = build_detector(
            family.config, seed=0, cache_train_cls_branches=True)
    else:  # the config's default: the module's model, copied
        model = copy.deepcopy(model).train()
        assert model.cache_train_cls_branches is False
        assert all(p.grad is None for p in model.parameters())
    losses = model.loss(batch_inputs(cache), copy.deepcopy(cache.data_samples))
    assert set(losses) == set(family.loss_keys)
    sum(losses[k] for k in family.loss_keys if k != 'acc').backward()
    depth = len(family.head.split('.')) + 1
    with_grad = {
        '.'.join(name.split('.')[:depth])
        for name, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    califormer = f'{family.head}.califormer'
    assert with_grad == ({califormer, f'{family.head}.{family.cls}'}
                         if train_cls else {califormer})
    cls_modules = {f'{family.head}.{m}' for m in family.cls_modules}
    assert set(model.calibrator_modules()) == {califormer} | (
        cls_modules if train_cls else set())


@families()
def test_cached_batches_through_the_preprocessor(family, model, cache):
    model.train()
    data = model.data_preprocessor(dataset_batch(cache), True)
    assert torch.equal(data['inputs']['targets'],
                       torch.as_tensor(cache.targets))
    assert all(ds.prior.shape == (K, K) for ds in data['data_samples'])
    losses = model.loss(data['inputs'], data['data_samples'])
    assert torch.isfinite(
        sum(losses[k] for k in family.loss_keys if k != 'acc'))
    # a decoder cache's batch, or features of another width, are refused
    decoder = dict(data['inputs'])
    del decoder['targets']
    with pytest.raises(TypeError, match='decoder cache'):
        model.loss(decoder, data['data_samples'])
    narrow = dict(data['inputs'])
    half = narrow['hidden_states'].shape[-1] // 2
    narrow['hidden_states'] = narrow['hidden_states'][..., :half]
    with pytest.raises(TypeError, match=f'{half}-wide'):
        model.loss(narrow, data['data_samples'])


@families()
def test_the_calibrator_config_builds_the_written_out_twin(family, model):
    cfg = get_config(family.config)
    parent = get_config(family.parent)
    plain = get_config(family.baseline)
    assert cfg.model.type == 'CachedCalibration'
    assert cfg.model.detector == parent.model.type == family.detector
    assert type(model) is getattr(detectors, f'Cached{family.detector}')
    assert isinstance(model, getattr(detectors, family.detector))
    assert isinstance(model, detectors.CachedCalibrationMixin)
    # named as the detector (reports, exports), found by its qualified name
    assert type(model).__name__ == family.detector
    assert type(model).__qualname__ == f'Cached{family.detector}'
    assert model.cache_kind() == family.kind
    assert model.cache_width() == feature_width(family,
                                                calibrated_head(model, family))
    assert cfg.model.data_preprocessor.type == 'DecoderCachePreprocessor'
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == 'DecoderCacheDataset'
    assert dataset.source.config.endswith(family.baseline)
    assert dataset.source.num_locations == family.num_locations
    if family.kind == 'roi':
        assert plain.model.train_cfg.rcnn.sampler.num == family.num_locations
    assert cfg.optim_wrapper.constructor == \
        'CalibratorOptimWrapperConstructor'
    assert cfg.optim_wrapper.optimizer.lr == 2e-4
    # the parent's head but for the CaliFormer's initial output (V' = 0)
    top, *inner = family.head.split('.')
    expected = copy.deepcopy(parent.model[top])
    califormer = expected
    for key in inner:
        califormer = califormer[key]
    califormer.califormer.zero_init_output = True
    assert cfg.model[top] == expected
    if family.kind == 'roi':  # the CaliFasterRCNN's starts at V' = 0 too
        assert cfg.model[top] == parent.model[top]
    # the baseline is the CaliDet model without its CaliDet parts
    assert 'backbone' in cfg.model
    for key in ('backbone', 'neck', 'train_cfg', 'test_cfg', 'rpn_head'):
        assert family.kind != 'roi' or key in cfg.model, key
        assert cfg.model.get(key) == plain.model.get(key), key


@pytest.mark.slow
@families(*TOOL_FAMILIES)
def test_tools_train_runs_the_cached_config(family, checkpoint, tmp_path):
    """tools/train.py makes the cache from the baseline checkpoint and
    updates the CaliFormer alone for 3 iterations."""
    proc = run_tool(
        'tools/train.py',
        'configs/' + family.config,
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        f'load_from={checkpoint}',
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
    meta = DecoderCache.open(str(tmp_path / 'cache')).meta
    assert meta['head'] == family.kind
    state = torch.load(
        osp.join(tmp_path, 'iter_3.pth'), weights_only=False)['state_dict']
    before = torch.load(checkpoint, weights_only=False)['state_dict']
    assert before
    for key, value in before.items():
        assert torch.equal(state[key], value), key


@pytest.mark.slow
@families(*TOOL_FAMILIES)
def test_the_cache_tool_makes_and_checks_a_cache(family, checkpoint, tmp_path,
                                                 capsys, monkeypatch):
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    main = runpy.run_path(
        osp.join(PROJECT_ROOT,
                 'tools/analysis_tools/cache_decoder_outputs.py'),
        run_name='tool')['main']
    out = str(tmp_path / 'cache')
    args = [
        osp.join(PROJECT_ROOT, 'configs', family.baseline), checkpoint,
        '--out', out, '--num-images', '2', '--no-progress'
    ]
    if family.kind == 'roi':
        made, valid = '128 RoIs of a box head', '128 RoIs'
    else:
        args += ['--num-locations', '300']
        made, valid = '300 locations of a dense head', '300 locations'
    assert main(args) == 0
    assert f'cached 2 entries x {made}' in capsys.readouterr().out
    assert main(args) == 0 and 'is up to date' in capsys.readouterr().out
    assert main(['--check', out]) == 0
    assert f'valid: 2 entries x {valid}' in capsys.readouterr().out


# the box head's own contract: the sampled RoIs


def image_losses(detector, labels, seed=0, **calibration):
    """mmdet's two-stage losses on the images of ``labels`` (the sampler
    seeded as :func:`small_cache`), what the box head's loss saw."""
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


@families('faster_rcnn')
def test_the_cache_holds_the_sampled_rois(family, baseline):
    assert is_roi_model(baseline)
    num = family.num_locations
    made = small_cache(family, baseline, num_locations=num + 8)
    d = baseline.roi_head.bbox_head.fc_cls.in_features
    assert made.meta['head'] == 'roi' and made.meta['num_levels'] == 1
    assert made.meta['num_classes'] == K
    assert made.hidden.shape == (3, 1, num + 8, d)
    assert made.boxes.shape == (3, 1, num + 8, 4)
    assert made.targets.shape == (3, num + 8, 4)
    level, label, positive, weight = np.moveaxis(made.targets, -1, 0)
    assert (level == 0).all()
    for i, labels in enumerate(LABELS):
        # the sampler's 128 RoIs (the ground truth among the positives),
        # then 8 padding rows of weight 0, background and zero features
        assert (weight[i, :num] == 1).all() and (weight[i, num:] == 0).all()
        assert (label[i, num:] == K).all()
        assert not made.hidden[i, 0, num:].any()
        pos = label[i] < K
        assert set(label[i][pos]) == set(labels)
        np.testing.assert_array_equal(positive[i], pos)
    assert ((made.boxes >= 0) & (made.boxes <= 1.5)).all()


@families('faster_rcnn')
def test_a_roi_cache_needs_its_counts_and_a_known_kind(family, baseline,
                                                       tmp_path):
    folder = str(tmp_path / 'cache')
    small_cache(family, baseline, labels=LABELS[:1], target=folder)
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


@families('faster_rcnn')
def test_more_rois_than_the_cache_holds_are_refused(family, baseline):
    with pytest.raises(ValueError, match='num_locations=100'):
        small_cache(family, baseline, labels=LABELS[:1], num_locations=100)


@families('faster_rcnn')
def test_cached_loss_is_the_box_head_loss_on_the_same_rois(family, answering):
    """The sampler seeded alike: the cache holds the RoIs the box head's
    loss on the images sampled, and the cached cross-entropy (over mmdet's
    avg_factor), accuracy and LoMa equal the head's under the same
    prior."""
    model = answering.eval()
    head = model.roi_head.bbox_head
    num = family.num_locations
    model.set_prior(random_prior(3))
    labels = (LABELS[0], LABELS[2])
    made = small_cache(family, model, labels, num_locations=num + 4, seed=5)
    priors = model.prior[None].expand(2, -1, -1)
    cali = model.deployment_cali_vectors()
    expected, record, samples = image_losses(
        model, labels, seed=5, cali_vectors=cali, priors=priors)
    # the same RoIs, in the same order
    rois = record['rois']
    for i in range(2):
        mine = rois[rois[:, 0] == i, 1:]
        assert len(mine) == num
        h, w = samples[i].metainfo['img_shape']
        cx = (mine[:, 0] + mine[:, 2]) / 2 / w
        torch.testing.assert_close(
            torch.as_tensor(made.boxes[i, 0, :num, 0]), cx)
    inputs = batch_inputs(made)
    with torch.no_grad():
        got = ROI.cached_losses(
            head, inputs, samples, cali, priors, train_cls=False)
        # the model's loss, per-image V' of each sample's prior
        for ds in samples:
            ds.prior = model.prior.clone()
        by_model = model.loss(inputs, samples)
    assert expected['loss_loma'] != 0
    for key in family.loss_keys:
        torch.testing.assert_close(got[key], expected[key], msg=key)
        torch.testing.assert_close(by_model[key], got[key], msg=key)


@families('faster_rcnn')
def test_zero_v_prime_gives_the_baselines_roi_logits(family, model, baseline):
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
    made = small_cache(family, baseline, labels=LABELS[:1], seed=2)
    _, record, _ = image_losses(baseline, LABELS[:1], seed=2)
    prior = torch.as_tensor(random_prior(4), dtype=torch.float32)
    with torch.no_grad():
        cali = head.get_cali_vectors(prior)
        got = ROI.calibrated_logits(head, torch.as_tensor(made.hidden[:, 0]),
                                    torch.stack([cali]))[0]
    assert torch.equal(cali, torch.zeros_like(cali))
    torch.testing.assert_close(got, record['cls_score'])
