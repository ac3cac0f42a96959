# Copyright (c) mmcalidet contributors. All rights reserved.
"""projects/context_shift/configs/: both twins train on generated data; the
many-class configs differ from them only in classes and data, and build
with K = 40."""
import os.path as osp

import numpy as np
import pytest
import torch

from mmcalidet.models.head_kinds import head_kind_of
from projects.context_shift.context_shift.data import (MANY_CLASS_SCENES,
                                                       make_context_shift,
                                                       variant_classes)
from testing import run_tool

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
CONFIGS = osp.join(ROOT, 'projects', 'context_shift', 'configs')


@pytest.fixture(scope='module')
def cs_data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('cs') / 'context_shift')
    make_context_shift(out, seed=0, num_train=8, num_val_per_site=2,
                       img_size=64, digit_size=(10, 16), progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize('config', [
    'projects/context_shift/configs/dino_tiny_context-shift.py',
    'projects/context_shift/configs/calidet_dino_tiny_context-shift.py'
])
def test_twins_train_two_iterations(cs_data, tmp_path, config):
    res = run_tool(
        'tools/train.py',
        config,
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        'train_cfg.max_iters=2',
        'train_cfg.val_interval=2',
        'default_hooks.checkpoint.interval=2',
        'load_from=None',
        'default_hooks.logger.interval=1',
        env=dict(MMCALIDET_CS_DATA=cs_data))
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert 'Iter(train) [2/2]' in log
    assert osp.isfile(tmp_path / 'iter_2.pth')
    if 'calidet' in config:
        assert 'loss_loma' in log


MANY_CLASS = {
    'dino_tiny_context-shift.py': 'dino_tiny_context-shift_many-class.py',
    'calidet_dino_tiny_context-shift.py':
    'calidet_dino_tiny_context-shift_many-class.py',
}


def _load(name, monkeypatch, data=None):
    from mmengine.config import Config
    if data is None:
        monkeypatch.delenv('MMCALIDET_CS_DATA', raising=False)
    else:
        monkeypatch.setenv('MMCALIDET_CS_DATA', data)
    return Config.fromfile(osp.join(CONFIGS, name))


@pytest.mark.parametrize('base', sorted(MANY_CLASS))
def test_many_class_configs_change_only_classes_and_data(base, monkeypatch):
    """Mapping the many-class config's classes, K, data folder and DINO
    checkpoint back to the base's gives the base config exactly."""
    many = _load(MANY_CLASS[base], monkeypatch).to_dict()
    ref = _load(base, monkeypatch).to_dict()
    classes = variant_classes('many-class')
    assert len(classes) == 40 and many['classes'] == classes

    def back(value):
        if isinstance(value, dict):
            return {k: back(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            if tuple(value) == classes:
                return ref['classes']
            return type(value)(back(v) for v in value)
        if isinstance(value, str):
            return value.replace('context_shift_many-class', 'context_shift')
        if value == 40 and not isinstance(value, bool):
            return 10
        return value

    assert 'data/context_shift/' not in repr(many)
    assert back(many) == ref


@pytest.fixture(scope='module')
def many_class_data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('cs') / 'context_shift_many-class')
    make_context_shift(out, seed=0, num_train=8, num_val_per_site=2,
                       img_size=64, digit_size=(10, 16), progress=False,
                       variant='many-class')
    return out


@pytest.mark.parametrize('name', sorted(MANY_CLASS.values()))
def test_many_class_configs_build_with_40_classes(name, many_class_data,
                                                  monkeypatch):
    from mmdet.registry import DATASETS, MODELS
    from mmengine.dataset import pseudo_collate
    cfg = _load(name, monkeypatch, many_class_data)
    # the dataset finds every generated class by name
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    assert list(dataset.metainfo['classes']) == list(
        variant_classes('many-class'))
    assert len(dataset) == 8
    labels = np.concatenate([
        [inst['bbox_label'] for inst in dataset.get_data_info(i)['instances']]
        for i in range(len(dataset))
    ])
    assert 2 * 8 <= len(labels) <= 4 * 8 and labels.max() < 40
    val = DATASETS.build(cfg.val_dataloader.dataset)
    # two images of each of the variant's sites
    assert len(val) == 2 * len(MANY_CLASS_SCENES['sites'])
    # the model: K = 40 everywhere, and one training step's losses
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    if 'calidet' in name:  # what PriorClassesHook does before training
        model.match_prior_classes(list(dataset.metainfo['classes']))
    assert model.bbox_head.num_classes == 40
    assert head_kind_of(model).class_weight(model.bbox_head).shape[0] == 40
    if 'calidet' in name:
        assert tuple(model.prior.shape) == (40, 40)
        (sampler, ) = model.data_preprocessor.batch_augments
        assert sampler.num_classes == 40
        assert sampler.dataset_prior.shape == (40, 40)
    model.train()
    data = model.data_preprocessor(
        pseudo_collate([dataset[0], dataset[1]]), True)
    if 'calidet' in name:
        assert tuple(data['data_samples'][0].prior.shape) == (40, 40)
    losses = model.loss(data['inputs'], data['data_samples'])
    if 'calidet' in name:
        assert any('loma' in key for key in losses)
    assert 'loss_cls' in losses
    for key, value in losses.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        assert all(torch.isfinite(v).all() for v in values), key
