# Copyright (c) mmcalidet contributors. All rights reserved.
"""Reuse proves identity: a benchmark training is reused only on the data
it was trained on, a benchmark data folder only when it is the data asked
for, and a feature cache only by the head kind and width that made it."""
import argparse
import json
import os.path as osp

import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.config import Config, DictAction
from mmengine.structures import InstanceData

from mmcalidet.datasets import DecoderCacheDataset
from mmcalidet.decoder_cache import (CacheError, CacheKindError,
                                     DecoderCacheWriter, check_cache)
from projects.context_shift.context_shift import training
from testing import PROJECT_ROOT, build_detector

B, Q = 2, 6

# --- 1. a training is reused only on the data it was trained on ---------


def fake_data(folder,
              seed=0,
              variant='digits',
              validation_sites=False,
              train='[1]'):
    """A benchmark data folder: its meta.json and split files."""
    (folder / 'annotations').mkdir(parents=True, exist_ok=True)
    meta = dict(seed=seed, variant=variant, num_classes=10)
    if validation_sites:
        meta['validation_sites'] = dict(sim_a=dict(rule='r', images=1))
    (folder / 'meta.json').write_text(json.dumps(meta))
    (folder / 'annotations' / 'instances_train.json').write_text(train)
    (folder / 'annotations' / 'instances_val.json').write_text('[2]')
    return str(folder)


@pytest.fixture
def launched(monkeypatch):
    """The trainings the benchmark starts (recorded, not run)."""
    started = []

    class Recorded:

        def __init__(self, cmd, **kwargs):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(training, 'launch', Recorded)
    return started


@pytest.fixture
def trained(tmp_path):
    """A config and a work folder whose last checkpoint keeps the config
    a training on ``data`` ran with (as mmengine keeps it)."""
    config = tmp_path / 'c.py'
    config.write_text("model = dict(type='M')\nload_from = None\n")

    def train(data, options=None):
        work = tmp_path / 'work'
        work.mkdir(exist_ok=True)
        cfg = Config.fromfile(str(config))
        if options is None:
            options = training.data_options(training.data_identity(data))
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='*', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--o'] + options).o or {})
        torch.save(
            dict(meta=dict(cfg=cfg.pretty_text), state_dict={}),
            str(work / 'iter_4.pth'))
        return str(config), str(work)

    return train


def plan(config, work, data):
    return training.Training(config, work, 4, [], False, data, progress=False)


def test_a_training_is_reused_on_its_own_data_only(tmp_path, trained, launched,
                                                   capsys):
    data = fake_data(tmp_path / 'data')
    config, work = trained(data)
    plan(config, work, data)
    assert '[train] reusing' in capsys.readouterr().out and not launched
    # the same folder made again with another seed, as another variant, or
    # as validation sites: trained again, saying what differs
    cases = [(dict(seed=5), 'seed 0, not 5'),
             (dict(variant='many-class'), 'variant digits, not many-class'),
             (dict(validation_sites=True),
              'deployment sites, not validation sites'),
             (dict(train='[1, 3]'), 'other split files')]
    for change, words in cases:
        launched.clear()
        fake_data(tmp_path / 'data', **change)
        plan(config, work, data)
        out = capsys.readouterr().out
        assert f'was trained on other data ({words}' in out, out
        assert len(launched) == 1
        # the new run records the data it reads
        assert f'{training.DATA_KEY}.splits=' + training.splits_digest(
            data) in launched[0]
    # a checkpoint that records no data (trained before the record) is
    # trained again: it cannot prove what it was trained on
    fake_data(tmp_path / 'data')
    config, work = trained(data, options=[])
    launched.clear()
    plan(config, work, data)
    assert 'other data (no record of its data)' in capsys.readouterr().out
    assert len(launched) == 1


def test_the_data_identity_names_what_a_training_reads(tmp_path):
    data = fake_data(tmp_path / 'data', seed=3, validation_sites=True)
    identity = training.data_identity(data)
    assert identity['seed'] == 3 and identity['variant'] == 'digits'
    assert identity['validation_sites'] is True
    assert identity['splits'].startswith('sha256:')
    assert training.data_identity(str(tmp_path / 'none')) is None
    assert training.data_options(None) == [f'{training.DATA_KEY}=None']
    assert training.data_changes(identity, identity) == []


# --- 2. a data folder is reused only when it is the data asked for ------


def args_for(data, seed=0, variant='digits', validation_sites=False):
    return argparse.Namespace(
        data=str(data), seed=seed, variant=variant, no_progress=True,
        validation_sites=validation_sites)


@pytest.fixture
def generated(monkeypatch):
    """The generations the benchmark starts (recorded, not run)."""
    from projects.context_shift.context_shift import data as data_module
    calls = []

    def make(out_dir, **kwargs):
        calls.append((out_dir, kwargs))
        return dict(seed=kwargs['seed'], variant=kwargs['variant'])

    monkeypatch.setattr(data_module, 'make_context_shift', make)
    from projects.context_shift.context_shift import simulated_sites
    monkeypatch.setattr(simulated_sites, 'make_validation_data',
                        lambda out_dir, **kwargs: make(
                            out_dir, validation=True, **kwargs))
    return calls


def test_a_data_folder_of_other_data_is_refused(tmp_path, generated, capsys):
    digits = fake_data(tmp_path / 'mine')
    # asked for seed 5 of the many-class variant: not the digits' seed 0
    with pytest.raises(ValueError) as exc:
        training.ensure_data(args_for(digits, seed=5, variant='many-class'))
    message = str(exc.value)
    assert '\n' not in message and digits in message
    assert 'seed 0, not 5' in message
    assert 'variant digits, not many-class' in message
    # a validation-sites folder is not the benchmark's deployment sites
    sites = fake_data(tmp_path / 'sites', validation_sites=True)
    with pytest.raises(
            ValueError, match='validation sites, not the '
            'deployment sites'):
        training.ensure_data(args_for(sites))
    # ... unless validation sites are asked for (--validation-sites), when
    # the deployment sites are not
    assert training.ensure_data(args_for(sites, validation_sites=True))
    with pytest.raises(ValueError, match='deployment sites, not validation'):
        training.ensure_data(args_for(digits, validation_sites=True))
    # a folder without meta.json (a torn one) is not reused either
    (tmp_path / 'torn').mkdir()
    with pytest.raises(ValueError, match='no meta.json'):
        training.ensure_data(args_for(tmp_path / 'torn'))
    assert not generated
    # the data asked for is reused as it is
    meta = training.ensure_data(args_for(digits))
    assert meta['seed'] == 0 and not generated
    assert f'[data] reusing {digits}' in capsys.readouterr().out


def test_the_benchmarks_own_folder_of_other_data_is_made_again(
        tmp_path, generated, monkeypatch, capsys):
    own = fake_data(tmp_path / 'own')
    monkeypatch.setitem(training.VARIANTS['many-class'], 'data', own)
    meta = training.ensure_data(args_for(own, seed=5, variant='many-class'))
    assert meta == dict(seed=5, variant='many-class')
    assert generated == [
        (own,
         dict(seed=5, progress=False, variant='many-class', overwrite=True))
    ]
    assert 'is not the data asked for (seed 0, not 5' in \
        capsys.readouterr().out


# --- 3. a cache is used only by the head kind and width that made it ----


def _samples(num_classes):
    out = []
    for k in range(B):
        ds = DetDataSample(
            metainfo=dict(
                img_id=k,
                img_path=f'im{k}.jpg',
                img_shape=(64, 64),
                ori_shape=(64, 64),
                scale_factor=(1.0, 1.0),
                pad_shape=(64, 64),
                batch_input_shape=(64, 64)))
        gt = InstanceData()
        gt.bboxes = torch.tensor([[4., 4., 20., 20.]])
        gt.labels = torch.tensor([k % num_classes])
        ds.gt_instances = gt
        out.append(ds)
    return out


def targets_cache(folder, head, width=8, num_classes=80, classes=None):
    """A dense (``levels`` 3, soft scores) or roi (one level, positives of
    score 1) cache of synthetic features (of ``classes``)."""
    g = torch.Generator().manual_seed(0)
    targets = torch.zeros(B, Q, 4)
    targets[..., 1] = num_classes  # background
    targets[..., 3] = 1.0
    targets[:, 0, 1] = 0  # one positive per image
    if head == 'dense':
        targets[..., 0] = torch.arange(Q) % 3
        targets[:, 0, 2] = 0.6
        num_levels = 3
    else:
        targets[:, 0, 2] = 1.0
        num_levels = 1
    writer = DecoderCacheWriter(
        str(folder), fingerprint=dict(sha1='x'), classes=classes)
    writer.info.update(
        num_levels=num_levels, num_classes=num_classes, num_locations=Q)
    writer.add(
        torch.randn(1, B, Q, width, generator=g),
        torch.rand(1, B, Q, 4, generator=g) * 0.5 + 0.25,
        _samples(num_classes),
        0,
        targets=targets,
        head=head)
    writer.commit()
    return str(folder)


def relabel(folder, head):
    meta_file = osp.join(folder, 'meta.json')
    with open(meta_file) as f:
        meta = json.load(f)
    meta['head'] = head
    with open(meta_file, 'w') as f:
        json.dump(meta, f)


def test_check_refuses_a_cache_whose_head_is_not_its_content(tmp_path):
    import runpy
    tool = runpy.run_path(
        osp.join(PROJECT_ROOT, 'tools', 'analysis_tools',
                 'cache_decoder_outputs.py'),
        run_name='tool')
    for head in ('dense', 'roi'):
        folder = targets_cache(tmp_path / head, head)
        assert check_cache(folder)['head'] == head
    # a dense cache (3 levels, IoU scores) whose meta says roi
    relabel(str(tmp_path / 'dense'), 'roi')
    with pytest.raises(CacheError, match='"head": "roi".*levels'):
        tool['main'](['--check', str(tmp_path / 'dense')])
    # a dense or roi cache whose meta says decoder
    relabel(str(tmp_path / 'roi'), 'decoder')
    with pytest.raises(CacheError, match='"head": "decoder".*targets'):
        check_cache(str(tmp_path / 'roi'))


@pytest.fixture(scope='module')
def rtmdet_calibrator():
    return build_detector(
        'calidet/calidet_rtmdet_tiny_coco-mini_cached.py', seed=0)


def cached_batch(model, folder):
    dataset = DecoderCacheDataset(folder)
    items = [dataset[i] for i in range(len(dataset))]
    batch = dict(
        inputs={
            k: [it['inputs'][k] for it in items]
            for k in items[0]['inputs']
        },
        data_samples=[it['data_samples'] for it in items])
    model.train()
    return model.data_preprocessor(batch, True)


def test_a_cache_of_another_kind_is_refused_in_one_line(
        tmp_path, rtmdet_calibrator):
    model = rtmdet_calibrator
    assert model.cache_kind() == 'dense'
    width = model.cache_width()
    # a two-stage detector's RoI cache of the same width as the one-stage
    # head's features: refused, not trained on
    roi = targets_cache(tmp_path / 'roi', 'roi', width=width)
    data = cached_batch(model, roi)
    with pytest.raises(CacheKindError) as exc:
        model.loss(data['inputs'], data['data_samples'])
    message = str(exc.value)
    assert '\n' not in message and roi in message
    assert 'trains on a dense cache' in message
    assert 'is a roi cache' in message
    assert isinstance(exc.value, CacheError)  # one line from tools/train.py
    # of another kind and another width: the same refusal
    narrow = targets_cache(tmp_path / 'narrow', 'roi', width=width // 2)
    data = cached_batch(model, narrow)
    with pytest.raises(CacheKindError, match='dense cache.*is a roi cache'):
        model.loss(data['inputs'], data['data_samples'])
    # its own kind of another width: named by both widths
    dense = targets_cache(tmp_path / 'dense', 'dense', width=width // 2)
    data = cached_batch(model, dense)
    with pytest.raises(
            CacheKindError,
            match=f'classifies {width}-wide features, the cache '
            f'.* holds {width // 2}-wide'):
        model.loss(data['inputs'], data['data_samples'])
    # its own kind and width trains
    dense = targets_cache(tmp_path / 'fits', 'dense', width=width)
    data = cached_batch(model, dense)
    losses = model.loss(data['inputs'], data['data_samples'])
    assert torch.isfinite(sum(losses.values()).detach())


@pytest.mark.slow  # starts tools/train.py
def test_train_refuses_a_cache_of_another_kind(tmp_path, rtmdet_calibrator):
    from mmdet.datasets import CocoDataset

    from testing import run_tool
    roi = targets_cache(
        tmp_path / 'roi',
        'roi',
        width=rtmdet_calibrator.cache_width(),
        classes=CocoDataset.METAINFO['classes'])
    work = tmp_path / 'work'
    proc = run_tool(
        'tools/train.py',
        'configs/calidet/calidet_rtmdet_tiny_coco-mini_cached.py',
        '--work-dir',
        str(work),
        '--cfg-options',
        'load_from=None',
        'train_dataloader.dataset.source=None',
        f'train_dataloader.dataset.cache_dir={roi}',
        'train_cfg.max_iters=2',
        'default_hooks.checkpoint.interval=1',
        threads=1)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('train.py: error: ') and 'Traceback' not in \
        proc.stderr, proc.stderr[-3000:]
    assert 'trains on a dense cache' in last and 'is a roi cache' in last
    assert not list(work.glob('*.pth'))
