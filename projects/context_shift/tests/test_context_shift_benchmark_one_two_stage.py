# Copyright (c) mmcalidet contributors. All rights reserved.
"""``benchmark.py --detector rtmdet`` and ``--detector faster-rcnn``: the
tiny RTMDet's and Faster R-CNN's configs on the context-shift data (the
DINO's data settings, 10 classes, a CaliRTMDet calibrator on the RTMDet's
dense cache, a CaliFasterRCNN one on the Faster R-CNN's sampled RoIs),
their refusals, and a tiny run of each end to end (a few iterations on a
few generated scenes: every table, not the accuracy)."""
import json
import os.path as osp

import pytest
from mmengine.config import Config

from mmcalidet.calibration import DEFAULT_TRUST_RADIUS
from mmcalidet.utils.model_heads import classifying_head
from projects.context_shift.context_shift import (SITES, detector_configs,
                                                  schedule)
from testing import PROJECT_ROOT, build_detector

CONFIGS = osp.join(PROJECT_ROOT, 'projects', 'context_shift', 'configs')
DINO = osp.join(CONFIGS, 'dino_tiny_context-shift.py')
#: per --detector: plain and calibrator configs, names, the training
#: cache's folder, its items per image (RTMDet: every location of a 128 px
#: scene; Faster R-CNN: the sampler's RoIs) and a parameter bound (the
#: RTMDet narrowed for 2 CPU cores, _base_/rtmdet_size.py: RTMDet-tiny has
#: 4.9 M; the Faster R-CNN's 64-channel neck and heads on a ResNet-18)
DETECTORS = {
    'rtmdet':
    dict(
        plain=osp.join(CONFIGS, 'rtmdet_tiny_context-shift.py'),
        cached=osp.join(CONFIGS,
                        'calidet_rtmdet_tiny_context-shift_cached_support.py'),
        names=('RTMDet', 'CaliRTMDet'),
        cache='dense_cache_train',
        per_image=16 * 16 + 8 * 8 + 4 * 4,
        max_params=2.5e6),
    'faster-rcnn':
    dict(
        plain=osp.join(CONFIGS, 'faster-rcnn_tiny_context-shift.py'),
        cached=osp.join(
            CONFIGS,
            'calidet_faster-rcnn_tiny_context-shift_cached_support.py'),
        names=('FasterRCNN', 'CaliFasterRCNN'),
        cache='roi_cache_train',
        per_image=128,
        max_params=12.5e6),
}


@pytest.fixture(params=sorted(DETECTORS))
def detector(request):
    """``(--detector, its DETECTORS entry)``."""
    return request.param, DETECTORS[request.param]


@pytest.fixture(scope='module')
def data(tiny_bench_data) -> str:
    """The tiny benchmark data (conftest's ``tiny_bench_data``)."""
    return tiny_bench_data


def _data_settings(cfg: Config, loader: str) -> dict:
    """What of a data loader's dataset decides the images and labels."""
    dataset = cfg[loader].dataset
    return {
        k: dataset.get(k)
        for k in ('type', 'data_root', 'ann_file', 'data_prefix', 'metainfo',
                  'pipeline')
    }


def test_configs_take_the_dinos_data_and_build(data, detector, monkeypatch):
    name, d = detector
    monkeypatch.setenv('MMCALIDET_CS_DATA', data)
    dino, plain_cfg = Config.fromfile(DINO), Config.fromfile(d['plain'])
    cached = Config.fromfile(d['cached'])
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert _data_settings(plain_cfg,
                              loader) == _data_settings(dino, loader)
    for loader in ('val_dataloader', 'test_dataloader'):
        assert _data_settings(cached, loader) == _data_settings(dino, loader)
    assert plain_cfg.val_evaluator.ann_file == dino.val_evaluator.ann_file
    assert plain_cfg.train_dataloader.batch_size == 4
    # the calibrator: the CaliFormer of the CaliDet twin on the plain
    # detector's cache, E_t the default prior, AdamW as every calibrator
    assert cached.model.type == 'CachedCalibration'
    assert cached.model.detector == d['names'][1]
    assert cached.optim_wrapper.optimizer.type == 'AdamW'
    source = cached.train_dataloader.dataset.source
    assert osp.realpath(osp.join(PROJECT_ROOT,
                                 source.config)) == osp.realpath(d['plain'])
    assert source.num_locations == d['per_image']
    assert cached.model.prior == osp.join(data, 'priors', 'E_t.json')
    plain = build_detector(d['plain'])
    cali = build_detector(d['cached'])
    assert (type(plain).__name__, type(cali).__name__) == d['names']
    assert classifying_head(plain).num_classes == \
        classifying_head(cali).num_classes == 10
    assert sum(p.numel() for p in plain.parameters()) < d['max_params']
    # the CaliDet twin holds every weight of the plain detector (a
    # calibrator checkpoint loads into it and keeps the trunk)
    mine = cali.state_dict()
    for key, value in plain.state_dict().items():
        assert key in mine and mine[key].shape == value.shape, key


def test_refused_without_its_recipe(tmp_path, detector, benchmark_tool):
    name, d = detector
    tool = benchmark_tool
    args = tool.parse_args(['--detector', name])
    assert detector_configs(args)['names'] == d['names']
    assert detector_configs(args)['baseline_dir'] == name
    assert detector_configs(args)['cache_dir'] == d['cache']
    assert detector_configs(tool.parse_args([]))['names'] == ('DINO',
                                                              'CaliDINO')
    for extra, message in ((['--variant',
                             'many-class'], 'for --variant digits only'),
                           (['--calidet-init',
                             'finetune'], 'only --calidet-init cached')):
        with pytest.raises(ValueError, match=message):
            tool.main(['--detector', name, '--data',
                       str(tmp_path / 'd')] + extra)
        assert not osp.exists(tmp_path / 'd')  # checked before generating


def test_the_calirtmdets_calibrator_gets_10000_updates_at_either_budget(
        benchmark_tool):
    parse = benchmark_tool.parse_args
    for budget in ([], ['--quick']):
        args = parse(['--detector', 'rtmdet'] + budget)
        assert schedule(args)['calidet'] == 10000
        assert osp.join(PROJECT_ROOT, detector_configs(args)['cached']) \
            == DETECTORS['rtmdet']['cached']
    assert schedule(parse(['--quick']))['calidet'] == 3000  # the DINO's
    assert schedule(parse(['--detector', 'faster-rcnn',
                           '--quick']))['calidet'] == 3000
    assert schedule(
        parse(['--detector', 'rtmdet', '--calibrator-updates',
               '7']))['calidet'] == 7


@pytest.fixture(scope='module', params=sorted(DETECTORS))
def benchmarked(request, data, tmp_path_factory, benchmark_command_line):
    """``(--detector, its DETECTORS entry, work folder, exit status,
    output)`` of one tiny benchmark run per detector (3 iterations of the
    plain detector, 2 calibrator updates) that this module's tests share
    (conftest's ``benchmark_command_line``)."""
    name = request.param
    work = tmp_path_factory.mktemp(f'bench_{name}') / 'work'
    code, log = benchmark_command_line(
        '--detector', name, '--data', data, '--work-dir', str(work),
        '--dino-iters', '3', '--calibrator-updates', '2', '--self-cal-iters',
        '2', '--fit-repeats', '2', '--score-thr', '0', '--posthoc',
        'reweight', '--no-progress')
    return name, DETECTORS[name], work, code, log


@pytest.mark.slow
def test_the_plain_config_trains_with_tools_train(benchmarked):
    """The plain detector's config as ``tools/train.py`` runs it (the
    benchmark's training: its output in the work folder's train.log)."""
    name, _, work, code, log = benchmarked
    assert code == 0, log[-3000:]
    train_log = (work / name / 'train.log').read_text()
    assert 'Saving checkpoint at 3 iterations' in train_log, \
        train_log[-3000:]
    assert osp.isfile(work / name / 'iter_3.pth')


@pytest.mark.slow
def test_benchmark_writes_every_table(benchmarked):
    name, d, work, code, log = benchmarked
    plain_name, cali_name = d['names']
    assert code == 0, log[-3000:]
    # the plain detector trained in its own folder, its feature cache made
    # from its last checkpoint, the CaliDet twin's CaliFormer trained on it
    ckpt = work / name / 'iter_3.pth'
    assert osp.isfile(ckpt) and not osp.exists(work / 'dino')
    assert osp.isfile(work / f'calidet_{name}' / 'iter_2.pth')
    assert 'load_from=' + str(ckpt) in (work / f'calidet_{name}' /
                                        'train.log').read_text()
    with open(work / name / d['cache'] / 'meta.json') as f:
        assert json.load(f)['checkpoint_path'] == osp.abspath(ckpt)
    # the CaliDet twin keeps the plain detector's trunk: one feature cache
    assert 'one feature cache serves both' in log
    out = work / 'results'
    with open(out / 'results.json') as f:
        res = json.load(f)
    assert res['detector'] == name
    assert res['methods'] == dict(plain=plain_name, calidet=cali_name)
    assert res['schedule']['dino'] == 3 and res['schedule']['calidet'] == 2
    assert res['num_images'] == 3 * len(SITES)
    reweight = f'{plain_name} + marginal re-weighting'
    inj = {(r['method'], r['prior']) for r in res['injection']}
    for prior in ('flip(E_x)', 'E0', 'E_t', 'E_v', 'E_b', 'E_x',
                  'filled flip(E_x)', 'filled E_x'):
        assert (cali_name, prior) in inj and (reweight, prior) in inj
    assert (plain_name, '-') in inj
    assert not any('co-occurrence' in m for m, _ in inj)  # not asked for
    # the re-weighting is the identity at E_t: the plain detector's AP
    ap = {(r['method'], r['prior']): r['AP'] for r in res['injection']}
    assert ap[(reweight, 'E_t')] == pytest.approx(ap[(plain_name, '-')])
    takes_prior = [cali_name, reweight]
    cali = [r for r in res['sites'] if r['method'] == cali_name]
    assert [(r['site'], r['prior']) for r in cali] == [
        (s, p) for s in SITES for p in ('E_t', 'E_site(in-sample)', 'E_site')
    ]
    assert len(res['deployment']) == len(SITES) * len(takes_prior) * 2
    assert {r['method'] for r in res['deployment']} == set(takes_prior)
    assert len(res['sweep']) == len(SITES) * len(takes_prior) * 6 * 2
    assert len(res['self_calibration']) == len(SITES) * len(takes_prior)
    assert all(r['radius'] == DEFAULT_TRUST_RADIUS
               for r in res['self_calibration'])
    assert all(len(c) == 3 for c in res['curves'].values())
    assert len(res['online']) == len(SITES) * len(takes_prior)
    assert res['subsets']  # not --quick
    assert any(f'AP(E_t) of {cali_name} vs {plain_name}' in c
               for c in res['claims'])
    md = (out / 'results.md').read_text()
    assert md.startswith(
        f'# Context-shift benchmark results ({plain_name} and '
        f'{cali_name})')
    assert f'Schedule: plain {plain_name} 3 iterations' in md
    assert 'DINO' not in md
    for png in ('priors', 'sites', 'sweep', 'subsets', 'self_calibration'):
        assert f'![]({png}.png)' in md
        assert osp.getsize(out / f'{png}.png') > 1000
