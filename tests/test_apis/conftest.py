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

from mmcalidet.testing import data_root, get_config

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
