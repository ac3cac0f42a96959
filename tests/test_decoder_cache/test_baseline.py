# Copyright (c) mmcalidet contributors. All rights reserved.
"""match_baseline: a calibrator's load_from and its decoder cache's
checkpoint name one detector."""
import json
import shutil

import pytest
from mmengine.config import Config

from mmcalidet.decoder_cache import (CACHE_FORMAT, TrunkMismatchError,
                                     checkpoint_fingerprint, match_baseline,
                                     same_checkpoint)


def calibrator_cfg(load_from=None, source=None, cache_dir='cache'):
    dataset = dict(type='DecoderCacheDataset', cache_dir=str(cache_dir))
    if source is not None:
        dataset['source'] = source
    return Config(
        dict(load_from=load_from, train_dataloader=dict(dataset=dataset)))


@pytest.fixture
def checkpoints(tmp_path):
    """Two detectors' files and a copy of the first at another path."""
    a, b, copy = (
        str(tmp_path / name) for name in ('a.pth', 'b.pth', 'copy_of_a.pth'))
    with open(a, 'wb') as f:
        f.write(b'weights of detector A' * 100)
    with open(b, 'wb') as f:
        f.write(b'weights of detector B' * 100)
    shutil.copy(a, copy)
    return a, b, copy


def test_one_setting_names_both(checkpoints):
    a, _, _ = checkpoints
    # load_from gives the cache its detector
    cfg = calibrator_cfg(load_from=a, source=dict(config='dino.py'))
    assert match_baseline(cfg) == a
    assert cfg.train_dataloader.dataset.source.checkpoint == a
    # and the cache's detector is loaded when load_from is not set
    cfg = calibrator_cfg(source=dict(config='dino.py', checkpoint=a))
    assert match_baseline(cfg) == a and cfg.load_from == a


def test_a_wrapped_cache_dataset_is_found(checkpoints):
    a, b, _ = checkpoints
    cfg = calibrator_cfg(load_from=a, source=dict(config='dino.py'))
    inner = cfg.train_dataloader.dataset
    cfg.train_dataloader.dataset = dict(
        type='RepeatDataset', times=2, dataset=inner)
    assert match_baseline(cfg) == a
    assert cfg.train_dataloader.dataset.dataset.source.checkpoint == a
    cfg.train_dataloader.dataset.dataset.source.checkpoint = b
    with pytest.raises(TrunkMismatchError):
        match_baseline(cfg)


def test_two_detectors_are_refused_naming_both(checkpoints):
    a, b, copy = checkpoints
    cfg = calibrator_cfg(
        load_from=a, source=dict(config='dino.py', checkpoint=b))
    with pytest.raises(TrunkMismatchError) as info:
        match_baseline(cfg)
    message = str(info.value)
    assert '\n' not in message and a in message and b in message
    # the same weights at another path are the same detector
    assert same_checkpoint(a, copy) and not same_checkpoint(a, b)
    cfg = calibrator_cfg(
        load_from=copy, source=dict(config='dino.py', checkpoint=a))
    assert match_baseline(cfg) == copy


def test_an_existing_cache_of_another_detector_is_refused(
        checkpoints, tmp_path):
    a, b, copy = checkpoints
    cache = tmp_path / 'cache'
    cache.mkdir()
    with open(cache / 'meta.json', 'w') as f:
        json.dump(
            dict(
                format=CACHE_FORMAT,
                arrays={},
                fingerprint=dict(checkpoint=checkpoint_fingerprint(b)),
                checkpoint_path=b), f)
    with pytest.raises(TrunkMismatchError, match='cache') as info:
        match_baseline(calibrator_cfg(load_from=a, cache_dir=cache))
    assert a in str(info.value) and b in str(info.value)
    # its own detector, at any path
    assert match_baseline(calibrator_cfg(load_from=b, cache_dir=cache)) == b
    # no cache yet (the dataset says so), or not a calibrator config
    assert match_baseline(
        calibrator_cfg(load_from=a, cache_dir=tmp_path / 'none')) == a
    other = Config(
        dict(load_from=a, train_dataloader=dict(dataset=dict(type='Coco'))))
    assert match_baseline(other) is None
