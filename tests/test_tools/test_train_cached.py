# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/train.py with a calibrator config (cached decoder outputs), for
DINO and Deformable DETR: the cache is made from the baseline's checkpoint,
only the CaliFormer learns, and the checkpoint is a normal checkpoint of the
CaliDet detector."""
import os
import os.path as osp
import re

import pytest
import torch
from mmengine.runner import save_checkpoint

from mmcalidet.apis import inference_detector, init_detector
from testing import build_detector, data_root, run_tool

pytestmark = pytest.mark.slow

ITERS = 4
# (calibrator config, baseline config, CaliDet config), under configs/
DETECTORS = {
    'dino': ('calidet/calidet_dino_tiny_coco-mini_cached.py',
             'calidet/dino_tiny_coco-mini.py',
             'calidet/calidet_dino_tiny_coco-mini.py'),
    'deformable-detr': (
        'calidet/calidet_deformable-detr_tiny_coco-mini_cached.py',
        'calidet/deformable-detr_tiny_coco-mini.py',
        'calidet/calidet_deformable-detr_tiny_coco-mini.py'),
}


@pytest.fixture(scope='module', params=sorted(DETECTORS))
def calibrated(request, tmp_path_factory):
    """(work dir, baseline checkpoint, train.py's output, CaliDet config)
    of a 4-update calibrator training on a random baseline's cache."""
    cached, baseline, cali = DETECTORS[request.param]
    work_dir = tmp_path_factory.mktemp('cached')
    dino = build_detector(baseline, seed=0)
    dino_file = str(work_dir / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    proc = run_tool(
        'tools/train.py', 'configs/' + cached, '--work-dir', str(work_dir),
        '--cfg-options', f'load_from={dino_file}',
        f'train_dataloader.dataset.source.checkpoint={dino_file}',
        f'train_dataloader.dataset.cache_dir={work_dir}/cache',
        'train_dataloader.dataset.source.indices=[0,1,2,3,4,5]',
        'train_dataloader.dataset.source.progress=False',
        f'train_cfg.max_iters={ITERS}', 'train_cfg.val_interval=1000',
        'train_cfg.val_begin=1000',
        f'default_hooks.checkpoint.interval={ITERS}',
        'default_hooks.logger.interval=1', 'randomness.seed=0',
        threads=1)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    return str(work_dir), dino_file, output, 'configs/' + cali


def test_cached_training_logs_the_calibrated_losses(calibrated):
    work_dir, _, output, _ = calibrated
    assert osp.isfile(osp.join(work_dir, 'cache', 'hidden.npy'))
    steps = re.findall(r'Iter\(train\) \[\s*(\d+)/', output)
    assert steps[-1] == str(ITERS)
    for key in ('loss_cls', 'd0.loss_cls', 'loss_loma', 'd0.loss_loma'):
        assert f' {key}: ' in output
    assert 'dn_loss_cls' not in output and 'enc_loss_cls' not in output


def test_only_the_califormer_changed(calibrated):
    work_dir, dino_file, _, _ = calibrated
    ckpt = torch.load(
        osp.join(work_dir, f'iter_{ITERS}.pth'), weights_only=False)
    dino = torch.load(dino_file, weights_only=False)['state_dict']
    state = ckpt['state_dict']
    for key, value in dino.items():
        assert torch.equal(state[key], value), key
    # the optimizer updated exactly the CaliFormer's tensors, ITERS times
    cali = [k for k in state if k.startswith('bbox_head.califormer.')]
    opt_state = ckpt['optimizer']['state']
    assert len(opt_state) == len(cali)
    assert all(int(s['step']) == ITERS for s in opt_state.values())


def test_checkpoint_loads_as_a_normal_calidet_detector(calibrated):
    work_dir, _, _, cali = calibrated
    model = init_detector(
        cali, osp.join(work_dir, f'iter_{ITERS}.pth'), device='cpu')
    img = osp.join(data_root(), 'coco-mini', 'images', 'val2017')
    img = osp.join(img, sorted(os.listdir(img))[0])
    result = inference_detector(model, img, prior='coco2017_train')
    assert len(result.pred_instances) > 0
