# Copyright (c) mmcalidet contributors. All rights reserved.
"""The protocol's test loops and the online self-calibration hook, run by
mmengine's Runner on the tiny CaliDINO config."""
import json
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.structures import InstanceData

from mmcalidet.priors import load_prior
from testing import get_config

pytestmark = pytest.mark.slow


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
    # test() loads no checkpoint and, unlike train(), does not initialise
    # the weights: parameters mmdet creates empty (DINO's level_embed)
    # would hold whatever memory they got, NaN included, depending on the
    # tests that ran before in the process
    runner.model.init_weights()
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

    # the removed fitted threshold and statistics bias are refused
    runner._test_loop = dict(
        type='SelfCalibrationTestLoop', score_thr=0.5, stats_bias=True)
    with pytest.raises(TypeError, match='stats_bias'):
        runner.test()


#: the detections the model is made to return, per image: (labels, scores)
DETECTIONS = [([1, 2, 5], [0.9, 0.8, 0.1]), ([1, 3], [0.6, 0.7])]


def expected_online_priors(prior, momentum, eta, score_thr=0.3):
    """E_c after each image with ``warmup=0, update_interval=1``, from the
    definition (mmcalidet/calibration/online.py, the paper's Algo. 1 on
    running statistics): per image ``p`` (classes predicted with a score
    >= ``score_thr``) and ``z`` (their max scores); ``C <- m C + p p^T``,
    ``n <- m n + p``, ``s <- m s + z``, ``w <- m w + 1``; ``E_i = C / n``
    (0.5 where ``n`` = 0, diagonal 1), ``Z[:, j] = s_j / w``,
    ``E_c <- clip(E_c + eta * Z * (E_i - E_c), 0, 1)``, diagonal 1."""
    k = prior.shape[0]
    pairs, counts, score_sum, weight = np.zeros((k, k)), np.zeros(k), \
        np.zeros(k), 0.0
    out = []
    for labels, scores in DETECTIONS:
        z = np.zeros(k)
        for label, score in zip(labels, scores):
            if score >= score_thr:
                z[label] = max(z[label], score)
        p = (z > 0).astype(float)
        pairs = momentum * pairs + np.outer(p, p)
        counts = momentum * counts + p
        score_sum = momentum * score_sum + z
        weight = momentum * weight + 1
        stats = np.full((k, k), 0.5)
        stats[:, counts > 0] = pairs[:, counts > 0] / counts[counts > 0]
        np.fill_diagonal(stats, 1)
        prior = np.clip(
            prior + eta * (score_sum / weight)[None] * (stats - prior), 0, 1)
        np.fill_diagonal(prior, 1)
        out.append(prior)
    return out


def test_online_self_calibration_hook(runner, monkeypatch):
    model = runner.model
    saved = model.get_prior()
    # the model returns known detections (DETECTIONS), whatever its random
    # weights, and records the prior it was called under
    called_under = []

    def predict(batch_inputs, batch_data_samples, rescale=True):
        for sample in batch_data_samples:
            labels, scores = DETECTIONS[len(called_under)]
            called_under.append(model.get_prior())
            sample.pred_instances = InstanceData(
                bboxes=torch.tensor([[0., 0., 10., 10.]] * len(labels)),
                scores=torch.tensor(scores),
                labels=torch.tensor(labels))
        return batch_data_samples

    monkeypatch.setattr(model, 'predict', predict)
    runner._test_loop = dict(type='TestLoop')
    runner.register_hook(
        dict(
            type='OnlineSelfCalibrationHook',
            warmup=0,
            update_interval=1,
            momentum=0.5,
            eta=0.8,
            trust_radius=None))  # Algo. 1's step, unbounded
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
    assert len(seen) == len(DETECTIONS)  # one image per batch
    expected = expected_online_priors(saved, momentum=0.5, eta=0.8)
    # E_c was updated after each image by Algo. 1's step ...
    for got, want in zip(seen, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # ... which moved the columns of the predicted classes (1, 2 after the
    # first image; class 5 scored under the threshold) towards E_i
    changed = np.where(np.abs(seen[0] - saved).max(axis=0) > 1e-3)[0]
    assert changed.tolist() == [1, 2]
    assert seen[0][2, 1] > saved[2, 1] and seen[0][0, 1] < saved[0, 1]
    changed = np.where(np.abs(seen[1] - seen[0]).max(axis=0) > 1e-3)[0]
    assert changed.tolist() == [1, 2, 3]
    # ... and used for the next image
    np.testing.assert_array_equal(called_under[0], saved)
    np.testing.assert_allclose(called_under[1], seen[0], atol=1e-6)
    # restored after the epoch, the final E_c saved by class name
    np.testing.assert_array_equal(model.get_prior(), saved)
    path = osp.join(runner.work_dir, 'self_calibrated_prior.json')
    final = load_prior(
        path,
        classes=model.dataset_meta['classes'] if getattr(
            model, 'dataset_meta', None) else None)
    np.testing.assert_allclose(final, expected[1], atol=1e-6)
