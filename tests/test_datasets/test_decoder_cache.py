# Copyright (c) mmcalidet contributors. All rights reserved.
"""DecoderCacheDataset / build_decoder_cache on the tiny coco-mini DINO."""
import os
import os.path as osp
import shutil
import socket

import pytest
import torch
from mmdet.registry import DATASETS
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.runner import save_checkpoint

from mmcalidet.datasets import DecoderCacheDataset
from mmcalidet.decoder_cache import (DecoderCache, build_decoder_cache,
                                     cache_hidden_states, stale_reasons,
                                     train_fingerprint)
from testing import (PROJECT_ROOT, build_detector, captured_log,
                     damage_cache_file)

INDICES = [0, 3, 5]
#: a file of the cache and what happens to it
CORRUPTIONS = [('hidden.npy', 'truncate'), ('boxes.npy', 'truncate'),
               ('gt_labels.npy', 'truncate'), ('hidden.npy', 'delete'),
               ('gt_offsets.npy', 'delete'), ('metainfo.json', 'garble')]


def is_current(out, config, ckpt, passes, indices, dtype, batch_size=8):
    return not stale_reasons(
        out, train_fingerprint(config, ckpt, passes, indices, batch_size,
                               dtype))


def reasons(out, config, ckpt, passes, indices, dtype, batch_size=8):
    return stale_reasons(
        out, train_fingerprint(config, ckpt, passes, indices, batch_size,
                               dtype))


@pytest.fixture(scope='module')
def dino(tmp_path_factory):
    """A tiny DINO checkpoint and a config whose training pipeline has no
    random flip (so a direct forward can be compared)."""
    root = tmp_path_factory.mktemp('dino')
    model = build_detector('calidet/dino_tiny_coco-mini.py', seed=0)
    ckpt = str(root / 'dino.pth')
    save_checkpoint(dict(state_dict=model.state_dict()), ckpt)
    config = str(root / 'dino_noflip.py')
    base = osp.join(PROJECT_ROOT, 'configs', 'calidet',
                    'dino_tiny_coco-mini.py')
    with open(config, 'w') as f:
        f.write(f"_base_ = '{base}'\n"
                'train_dataloader = dict(dataset=dict(pipeline=[\n'
                "    dict(type='LoadImageFromFile'),\n"
                "    dict(type='LoadAnnotations', with_bbox=True),\n"
                "    dict(type='Resize', scale=(256, 256), keep_ratio=True),\n"
                "    dict(type='PackDetInputs')]))\n")
    return model, config, ckpt


def test_cache_holds_every_decoder_layer_and_the_ground_truth(dino, tmp_path):
    model, config, ckpt = dino
    out = str(tmp_path / 'cache')
    # one batch, as below (padding to the batch's largest image changes
    # the features)
    build_decoder_cache(
        config, ckpt, out, indices=INDICES, batch_size=3, progress=False)
    assert not [f for f in os.listdir(tmp_path) if 'partial' in f]
    dataset = DecoderCacheDataset(out)
    assert len(dataset) == len(INDICES)
    assert dataset.num_layers == 2
    assert len(dataset.metainfo['classes']) == 80

    # the same images through the model directly
    source = DATASETS.build(Config.fromfile(config).train_dataloader.dataset)
    model.eval()
    batch = model.data_preprocessor(
        pseudo_collate([source[i] for i in INDICES]), False)
    with torch.no_grad():
        head_inputs = model.forward_transformer(
            model.extract_feat(batch['inputs']), batch['data_samples'])
        _, boxes = model.bbox_head(head_inputs['hidden_states'],
                                   head_inputs['references'])
    for k, ds in enumerate(batch['data_samples']):
        item = dataset[k]
        torch.testing.assert_close(
            item['inputs']['hidden_states'],
            head_inputs['hidden_states'][:, k],
            rtol=1e-4,
            atol=1e-4)
        torch.testing.assert_close(
            item['inputs']['bbox_preds'], boxes[:, k], rtol=1e-4, atol=1e-5)
        gt = item['data_samples'].gt_instances
        assert torch.equal(gt.labels, ds.gt_instances.labels)
        torch.testing.assert_close(gt.bboxes, ds.gt_instances.bboxes)
        assert tuple(item['data_samples'].img_shape) == tuple(ds.img_shape)
    # the evaluation's reader of the same folder: the last layer
    hidden, bbox, samples = DecoderCache.open(out).get([2, 0])
    torch.testing.assert_close(
        hidden, head_inputs['hidden_states'][-1, [2, 0]], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bbox, boxes[-1, [2, 0]], rtol=1e-4, atol=1e-5)
    assert [s.img_id for s in samples
            ] == [batch['data_samples'][k].img_id for k in (2, 0)]


@pytest.mark.slow  # makes decoder caches several times
def test_source_makes_the_cache_once_and_again_when_stale(dino, tmp_path):
    model, config, ckpt = dino
    out = str(tmp_path / 'cache')
    source = dict(
        config=config, checkpoint=ckpt, indices=INDICES[:2], progress=False)
    with captured_log() as lines:
        DecoderCacheDataset(out, source=source)
    # a first cache gives no reason for being made
    assert not [line for line in lines if 'making it again' in line]
    stamp = os.stat(osp.join(out, 'hidden.npy')).st_mtime_ns
    DecoderCacheDataset(out, source=source)  # up to date: reused
    assert os.stat(osp.join(out, 'hidden.npy')).st_mtime_ns == stamp
    assert is_current(out, config, ckpt, 1, INDICES[:2], 'float32')
    assert not is_current(out, config, ckpt, 2, INDICES[:2], 'float32')
    # ... and why
    assert reasons(out, config, ckpt, 1, INDICES[:2], 'float32') == []
    assert reasons(out, config, ckpt, 2, INDICES[:3], 'float16', 4) == [
        'passes changed', 'indices changed', 'batch_size changed',
        'dtype changed'
    ]
    assert reasons(
        str(tmp_path / 'none'), config, ckpt, 1, INDICES[:2],
        'float32') == ['no cache']
    # the same config at another path (another clone): still current; an
    # edited training pipeline: stale
    moved = str(tmp_path / 'moved.py')
    with open(moved, 'w') as f:
        f.write(f"_base_ = '{config}'\n")
    assert is_current(out, moved, ckpt, 1, INDICES[:2], 'float32')
    edited = str(tmp_path / 'edited.py')
    with open(edited, 'w') as f:
        f.write(f"_base_ = '{config}'\n"
                'train_dataloader = dict(dataset=dict(pipeline=[\n'
                "    dict(type='LoadImageFromFile'),\n"
                "    dict(type='LoadAnnotations', with_bbox=True),\n"
                "    dict(type='Resize', scale=(128, 128), keep_ratio=True),\n"
                "    dict(type='PackDetInputs')]))\n")
    assert not is_current(out, edited, ckpt, 1, INDICES[:2], 'float32')
    assert reasons(out, edited, ckpt, 1, INDICES[:2],
                   'float32') == ['config changed']
    # the same checkpoint copied elsewhere: current
    copy = str(tmp_path / 'copy.pth')
    shutil.copy(ckpt, copy)
    assert is_current(out, config, copy, 1, INDICES[:2], 'float32')
    # another checkpoint at the same path: stale, made again
    state = model.state_dict()
    state['bbox_head.cls_branches.0.bias'] = state[
        'bbox_head.cls_branches.0.bias'] + 1
    save_checkpoint(dict(state_dict=state), ckpt)
    assert reasons(out, config, ckpt, 1, INDICES[:2],
                   'float32') == ['checkpoint changed']
    # made again, saying why
    with captured_log() as lines:
        DecoderCacheDataset(out, source=source)
    assert os.stat(osp.join(out, 'hidden.npy')).st_mtime_ns != stamp
    assert f'decoder cache {out}: checkpoint changed; making it again' in lines


def test_missing_cache_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match='source=dict'):
        DecoderCacheDataset(str(tmp_path / 'nothing'))


def test_bad_arguments(dino, tmp_path):
    _, config, ckpt = dino
    with pytest.raises(ValueError, match='passes'):
        build_decoder_cache(config, ckpt, str(tmp_path / 'c'), passes=0)
    with pytest.raises(ValueError, match='out of range'):
        build_decoder_cache(
            config, ckpt, str(tmp_path / 'c'), indices=[10**6], progress=False)
    assert not [f for f in os.listdir(tmp_path) if 'partial' in f]


@pytest.fixture(scope='module')
def made(dino, tmp_path_factory):
    """A cache of two images as a dataset ``source`` makes it."""
    _, config, ckpt = dino
    out = str(tmp_path_factory.mktemp('made') / 'cache')
    source = dict(
        config=config, checkpoint=ckpt, indices=INDICES[:2], progress=False)
    DecoderCacheDataset(out, source=source)
    return out, source


@pytest.mark.parametrize('name,how', CORRUPTIONS)
def test_a_torn_cache_is_an_error_naming_the_file(made, tmp_path, name, how):
    out = str(tmp_path / 'cache')
    shutil.copytree(made[0], out)
    path = damage_cache_file(out, name, how)
    with pytest.raises(ValueError, match=f'decoder cache file {path}: '):
        DecoderCacheDataset(out)


@pytest.mark.parametrize('name,how', [('hidden.npy', 'truncate'),
                                      ('gt_offsets.npy', 'delete'),
                                      ('metainfo.json', 'garble')])
def test_a_torn_cache_is_made_again_from_its_source(made, tmp_path, name, how):
    source = made[1]
    out = str(tmp_path / 'cache')
    shutil.copytree(made[0], out)
    damage_cache_file(out, name, how)
    # a partial folder of a killed build
    stale = tmp_path / f'.cache.partial-{2**22 + 1}-0123abcd@' \
        f'{socket.gethostname()}'
    stale.mkdir()
    with captured_log() as lines:
        dataset = DecoderCacheDataset(out, source=source)
    assert len(
        dataset) == 2 and dataset[1]['inputs']['hidden_states'].shape[0] == 2
    remade = [line for line in lines if 'making it again' in line]
    assert len(remade) == 1 and remade[0].startswith(
        f'decoder cache {out}: {name} ')
    assert sorted(os.listdir(tmp_path)) == ['cache']
    # the same arrays as the intact cache
    torch.testing.assert_close(
        dataset[1]['inputs']['hidden_states'],
        DecoderCacheDataset(made[0])[1]['inputs']['hidden_states'])


def test_evaluation_caches_of_all_layers_train_a_calibrator(dino, tmp_path):
    """One format: a cache made by the evaluation's writer with every
    layer is a training set."""
    from mmengine.runner import Runner
    model, config, _ = dino
    cfg = Config.fromfile(config)
    cfg.test_dataloader.dataset.indices = 2
    loader = Runner.build_dataloader(cfg.test_dataloader)
    cache = cache_hidden_states(
        model,
        loader,
        cache_dir=str(tmp_path),
        fingerprint=dict(weights='dino'),
        layers='all',
        progress=False)
    dataset = DecoderCacheDataset(cache.folder)
    assert len(dataset) == 2 and dataset.num_layers == 2
    item = dataset[1]
    torch.testing.assert_close(item['inputs']['hidden_states'][-1],
                               cache.get([1])[0][0])


@pytest.mark.slow
def test_cache_tool_makes_the_cache_once(dino, tmp_path, capsys):
    import runpy
    import subprocess
    import sys
    _, config, ckpt = dino
    out = str(tmp_path / 'cache')
    script = 'tools/analysis_tools/cache_decoder_outputs.py'
    main = runpy.run_path(
        osp.join(PROJECT_ROOT, script), run_name='tool')['main']
    args = [config, ckpt, '--out', out, '--num-images', '2', '--no-progress']
    assert main(args) == 0
    assert 'cached 2 entries x 2 decoder layers' in capsys.readouterr().out
    assert len(DecoderCacheDataset(out)) == 2
    assert main(args) == 0 and 'is up to date' in capsys.readouterr().out
    assert main(['--check', out]) == 0
    assert 'valid: 2 entries x 2 decoder layers' in capsys.readouterr().out
    # a torn file: --check names it; a build makes the cache again
    damage_cache_file(out, 'boxes.npy', 'truncate')
    with pytest.raises(ValueError, match='boxes.npy: truncated'):
        main(['--check', out])
    assert main(args) == 0
    torn = capsys.readouterr().out
    assert f'decoder cache {out}: boxes.npy truncated' in torn
    assert 'cached 2 entries' in torn
    assert main(args[:-2] + ['1', '--no-progress']) == 0
    fewer = capsys.readouterr().out
    assert f'{out}: indices changed; making it again' in fewer
    assert 'cached 1 entries' in fewer
    # on the command line, a missing checkpoint: one line, exit status 1
    cmd = [sys.executable, script, config, str(tmp_path / 'none.pth')]
    bad = subprocess.run(
        cmd + args[2:],
        cwd=PROJECT_ROOT,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
        capture_output=True,
        text=True)
    assert bad.returncode == 1 and 'not found' in bad.stderr
    assert 'Traceback' not in bad.stderr


def test_making_the_cache_leaves_the_callers_random_numbers(dino, tmp_path):
    """A training run whose dataset makes the cache draws the same random
    numbers afterwards (its model's initial weights, the sampler's order)
    as a run that reuses the cache."""
    import random

    import numpy as np
    from mmengine.runner import set_random_seed

    def draws():
        return (random.random(), float(np.random.rand()),
                float(torch.rand(())))

    _, config, ckpt = dino
    set_random_seed(0)
    unmoved = draws()
    set_random_seed(0)
    DecoderCacheDataset(
        str(tmp_path / 'cache'),
        source=dict(
            config=config,
            checkpoint=ckpt,
            indices=INDICES[:2],
            progress=False))
    assert draws() == unmoved
