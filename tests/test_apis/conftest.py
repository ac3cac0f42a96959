# Copyright (c) mmcalidet contributors. All rights reserved.
"""A tiny CaliDINO checkpoint (random weights) for the inference tests."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import save_checkpoint

from testing import data_root, get_config

K = 80
CONFIG = 'calidet/calidet_dino_tiny_coco-mini.py'
register_all_modules()


def random_prior(seed: int) -> np.ndarray:
    """A valid K x K prior with random off-diagonal values."""
    prior = np.random.default_rng(seed).uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def val_image(name: str) -> str:
    return osp.join(data_root(), 'coco-mini', 'images', 'val2017', name)


@pytest.fixture(scope='session')
def images():
    """Two real images of the same size (480 x 640), so a batch of both
    needs no padding."""
    return [val_image('000000005001.jpg'), val_image('000000018575.jpg')]


@pytest.fixture(scope='session')
def config():
    """The tiny CaliDINO config, testing at 128 px (not 256) for speed."""
    cfg = get_config(CONFIG)
    for transform in cfg.test_dataloader.dataset.pipeline:
        if transform['type'] == 'Resize':
            transform['scale'] = (128, 128)
    return cfg


@pytest.fixture(scope='session')
def checkpoint(config, tmp_path_factory):
    """``(path, prior)``: a random-weight tiny CaliDINO saved with COCO's
    class names and a prior of its own (not the config's)."""
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(config.model))
    model.init_weights()
    prior = random_prior(100)
    model.set_prior(prior)
    path = str(tmp_path_factory.mktemp('ckpt') / 'tiny_calidino.pth')
    save_checkpoint(
        dict(
            state_dict=model.state_dict(),
            meta=dict(
                dataset_meta=dict(classes=CocoDataset.METAINFO['classes']))),
        path)
    return path, prior


@pytest.fixture(scope='session')
def bad_checkpoints(checkpoint, tmp_path_factory):
    """Checkpoints that must not load: ``{name: (path, error type, the
    message after the path)}``, made from ``checkpoint`` by editing tensors
    (no other model is built)."""
    from mmcalidet.utils.checkpoint import CheckpointReadError
    from mmcalidet.utils.checkpoint_compat import (CheckpointMismatchError,
                                                   InvalidCheckpointPriorError)
    folder = tmp_path_factory.mktemp('bad_ckpt')
    full = torch.load(checkpoint[0], map_location='cpu')
    state = full['state_dict']
    made = {}

    def save(name, state_dict, error, message):
        path = str(folder / f'{name}.pth')
        save_checkpoint(dict(full, state_dict=state_dict), path)
        made[name] = (path, error, message)

    # another class count: the classification layers and the prior
    small = {
        k: v[:20] if ('cls_branches' in k or 'califormer.nodes' in k)
        and v.shape[0] == K else v
        for k, v in state.items()
    }
    small['prior'] = torch.eye(20)
    save('classes20', small, CheckpointMismatchError,
         'does not fit CaliDINO: the checkpoint was trained for 20 classes, '
         'the model has 80.')
    plain = {
        k: v
        for k, v in state.items()
        if k != 'prior' and '.califormer.' not in k
    }
    save('plain_dino', plain, CheckpointMismatchError,
         "has no CaliDet calibration (a plain detector's)")
    nan = dict(state, prior=state['prior'].clone())
    nan['prior'][3, 4] = float('nan')
    save('nan_prior', nan, InvalidCheckpointPriorError,
         "has an invalid prior ('prior' of CaliDINO): prior has a "
         'non-finite value nan at [3, 4]')
    raw = open(checkpoint[0], 'rb').read()
    for name, data in (('empty', b''), ('truncated', raw[:len(raw) // 2]),
                       ('text', b'not a checkpoint\n')):
        path = str(folder / f'{name}.pth')
        with open(path, 'wb') as f:
            f.write(data)
        made[name] = (path, CheckpointReadError,
                      'is empty' if name == 'empty' else
                      'is truncated, corrupt or not a checkpoint')
    return made
