# Copyright (c) mmcalidet contributors. All rights reserved.
"""The protocol's test loops and the online self-calibration hook, run by
mmengine's Runner on the tiny CaliDINO config."""
import json
import os.path as osp

import numpy as np
import pytest
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmcalidet.priors import load_prior
from mmcalidet.testing import get_config


class Recorder(Hook):

    def __init__(self):
        self.iters = []
        self.epoch_metrics = []

    def after_test_iter(self,
                        runner,
                        batch_idx,
                        data_batch=None,
                        outputs=None):
        self.iters.append((batch_idx, len(outputs), 'pred_instances'
                           in outputs[0]))

    def after_test_epoch(self, runner, metrics=None):
        self.epoch_metrics.append(metrics)


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.work_dir = str(tmp_path_factory.mktemp('loops'))
    cfg.test_dataloader.dataset.indices = 2
    cfg.test_dataloader.batch_size = 1
    cfg.test_dataloader.dataset.pipeline[1].scale = (96, 96)
    cfg.test_cfg = dict(
        type='PriorSweepTestLoop',
        priors=['E0', 'E_t', 'E_x', 'site=coco2017_val'])
    cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    runner.recorder = Recorder()
    runner.register_hook(runner.recorder)
    return runner


def test_prior_sweep_loop(runner):
    metrics = runner.test()
    for key in ('E0', 'E_t', 'E_x', 'site'):
        assert f'{key}/coco/bbox_mAP' in metrics
    # one cached pass: the iteration hooks saw each batch once
    assert runner.recorder.iters == [(0, 1, True), (1, 1, True)]
    assert runner.recorder.epoch_metrics[-1] == metrics


def test_subset_and_self_calibration_loops(runner):
    runner._test_loop = dict(type='SubsetEvalTestLoop', sizes=[2, 64])
    metrics = runner.test()
    assert set(metrics) == {
        'subset2/epsilon',
        *(f'subset2/{p}/{m}' for p in ('E_t', 'E_b')
          for m in ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl'))
    }
    assert 0 < metrics['subset2/epsilon'] < 1

    runner._test_loop = dict(
        type='SelfCalibrationTestLoop', subset_size=2, iters=2, tol=0.0)
    metrics = runner.test()
    assert metrics['selfcal/iters'] == 2 and metrics['selfcal/subsets'] == 1
    with open(osp.join(runner.log_dir, 'self_calibration.json')) as f:
        history = json.load(f)['history']
    assert [h['iter'] for h in history] == [0, 1, 2]
    assert osp.isfile(osp.join(runner.log_dir, 'self_calibration.png'))


def test_online_self_calibration_hook(runner):
    model = runner.model
    saved = model.get_prior()
    runner._test_loop = dict(type='TestLoop')
    runner.register_hook(
        dict(
            type='OnlineSelfCalibrationHook',
            warmup=0,
            update_interval=1,
            # the random tiny model's scores are low: count every
            # detection, so each image surely moves E_c
            score_thr=0.0,
            eta=1.0))
    seen = []

    class Spy(Hook):
        priority = 'LOWEST'

        def after_test_iter(self,
                            runner,
                            batch_idx,
                            data_batch=None,
                            outputs=None):
            seen.append(runner.model.get_prior())

    runner.register_hook(Spy())
    runner.test()
    # E_c was updated after each image and used for the next one. The
    # random tiny model's scores can be ~1e-6, so an update may be smaller
    # than np.allclose's tolerance: compare exactly
    assert np.abs(seen[0] - saved).max() > 0
    assert np.abs(seen[1] - seen[0]).max() > 0
    # restored after the epoch, the final E_c saved by class name
    np.testing.assert_array_equal(model.get_prior(), saved)
    path = osp.join(runner.work_dir, 'self_calibrated_prior.json')
    final = load_prior(
        path,
        classes=model.dataset_meta['classes'] if getattr(
            model, 'dataset_meta', None) else None)
    np.testing.assert_allclose(final, seen[1], atol=1e-6)
