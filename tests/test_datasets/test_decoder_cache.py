# Copyright (c) mmcalidet contributors. All rights reserved.
"""DecoderCacheDataset / build_decoder_cache on the tiny coco-mini DINO."""
import os
import os.path as osp
import shutil

import pytest
import torch
from mmdet.registry import DATASETS
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.runner import save_checkpoint

from mmcalidet.datasets import DecoderCacheDataset, build_decoder_cache
from mmcalidet.datasets.decoder_cache import cache_is_current, stale_reasons
from mmcalidet.testing import PROJECT_ROOT, build_detector, captured_log

INDICES = [0, 3, 5]


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
    assert cache_is_current(out, config, ckpt, 1, INDICES[:2], 'float32')
    assert not cache_is_current(out, config, ckpt, 2, INDICES[:2],
                                'float32')
    # ... and why
    assert stale_reasons(out, config, ckpt, 1, INDICES[:2], 'float32') == []
    assert stale_reasons(out, config, ckpt, 2, INDICES[:3], 'float16') == [
        'passes changed', 'indices changed', 'dtype changed'
    ]
    assert stale_reasons(
        str(tmp_path / 'none'), config, ckpt, 1, INDICES[:2],
        'float32') == ['no complete cache']
    # the same config at another path (another clone): still current; an
    # edited training pipeline: stale
    moved = str(tmp_path / 'moved.py')
    with open(moved, 'w') as f:
        f.write(f"_base_ = '{config}'\n")
    assert cache_is_current(out, moved, ckpt, 1, INDICES[:2], 'float32')
    edited = str(tmp_path / 'edited.py')
    with open(edited, 'w') as f:
        f.write(f"_base_ = '{config}'\n"
                'train_dataloader = dict(dataset=dict(pipeline=[\n'
                "    dict(type='LoadImageFromFile'),\n"
                "    dict(type='LoadAnnotations', with_bbox=True),\n"
                "    dict(type='Resize', scale=(128, 128), keep_ratio=True),\n"
                "    dict(type='PackDetInputs')]))\n")
    assert not cache_is_current(out, edited, ckpt, 1, INDICES[:2], 'float32')
    assert stale_reasons(out, edited, ckpt, 1, INDICES[:2],
                         'float32') == ['config changed']
    # the same checkpoint copied elsewhere: current
    copy = str(tmp_path / 'copy.pth')
    shutil.copy(ckpt, copy)
    assert cache_is_current(out, config, copy, 1, INDICES[:2], 'float32')
    # another checkpoint at the same path: stale, made again
    state = model.state_dict()
    state['bbox_head.cls_branches.0.bias'] = state[
        'bbox_head.cls_branches.0.bias'] + 1
    save_checkpoint(dict(state_dict=state), ckpt)
    assert stale_reasons(out, config, ckpt, 1, INDICES[:2],
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
            config, ckpt, str(tmp_path / 'c'), indices=[10**6],
            progress=False)
    assert not [f for f in os.listdir(tmp_path) if 'partial' in f]


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
