# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDetInferencer: mmdet's DetInferencer with a prior per call."""
import os.path as osp
from collections import Counter

import mmcv
import numpy as np
import pytest
import torch

from mmcalidet.apis import (CaliDetInferencer, inference_detector,
                            init_detector, prior_changes)
from mmcalidet.priors import default_prior_path, load_prior
from testing.tolerances import assert_same_predictions

K = 80


def random_prior(seed: int) -> np.ndarray:
    prior = np.random.default_rng(seed).uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


@pytest.fixture(scope='module')
def inferencer(config, checkpoint):
    return CaliDetInferencer(
        config, checkpoint[0], device='cpu', show_progress=False)


def predict(inferencer, inputs, **kwargs):
    return inferencer(inputs, return_datasamples=True, **kwargs)['predictions']


def assert_close(a, b, tol=0.0):
    a, b = a.pred_instances, b.pred_instances
    assert torch.equal(a.labels, b.labels)
    torch.testing.assert_close(a.scores, b.scores, atol=tol, rtol=0)
    torch.testing.assert_close(a.bboxes, b.bboxes, atol=tol * 1e3, rtol=0)


def test_call_with_a_prior_writes_the_visualisation(inferencer, images, config,
                                                    checkpoint, tmp_path):
    before = inferencer.model.get_prior()
    prior = random_prior(1)
    result = inferencer(
        images[0], prior=prior, out_dir=str(tmp_path), no_save_pred=False)
    vis = tmp_path / 'vis' / osp.basename(images[0])
    assert vis.is_file()
    assert mmcv.imread(str(vis)).shape == mmcv.imread(images[0]).shape
    assert (tmp_path / 'preds' /
            (osp.basename(images[0])[:-4] + '.json')).is_file()
    scores = result['predictions'][0]['scores']
    np.testing.assert_array_equal(inferencer.model.get_prior(), before)
    # the same as inference_detector on the same checkpoint
    model = init_detector(config, checkpoint[0], device='cpu')
    expected = inference_detector(model, images[0], prior=prior)
    np.testing.assert_allclose(
        scores, expected.pred_instances.scores.numpy(), atol=1e-6)
    default = predict(inferencer, images[0])[0]
    assert not np.allclose(scores, default.pred_instances.scores.numpy())


def test_per_image_priors_in_one_batch_equal_separate_calls(
        inferencer, images):
    first, second = random_prior(2), random_prior(3)
    batch = predict(inferencer, images, batch_size=2, prior=[first, second])
    # same-size images: the batch needs no padding, so only the prior
    # differs between the two routes (float error of batched kernels)
    assert_close(batch[0],
                 predict(inferencer, images[0], prior=first)[0], 1e-5)
    assert_close(batch[1],
                 predict(inferencer, images[1], prior=second)[0], 1e-5)
    # batched with one shared prior as well
    shared = predict(inferencer, images, batch_size=2, prior=first)
    assert_close(shared[0], batch[0], 1e-5)


def test_a_prior_at_construction_is_the_models_default(config, checkpoint,
                                                       images):
    site = CaliDetInferencer(
        config,
        checkpoint[0],
        device='cpu',
        show_progress=False,
        prior='coco2017_val')
    shipped = load_prior(default_prior_path('coco2017_val'))
    np.testing.assert_allclose(site.model.get_prior(), shipped, atol=1e-6)
    # the deployed V' and a call's per-sample V' reach the logits by other
    # kernels: the scores are the same within the tight tolerance
    assert_same_predictions(
        predict(site, images[0])[0],
        predict(site, images[0], prior=shipped)[0])


def test_bad_priors_are_rejected_before_the_model_runs(inferencer, images,
                                                       tmp_path):
    calls = []
    handle = inferencer.model.backbone.register_forward_pre_hook(
        lambda *args: calls.append(1))
    before = inferencer.model.get_prior()
    bad_diagonal = random_prior(4)
    bad_diagonal[5, 5] = 0.0
    try:
        for prior, message in ((np.eye(3), 'K=3'), (bad_diagonal,
                                                    'diagonal must be 1'),
                               ([random_prior(4)] * 3, '3 priors for 2'),
                               ('no_such_site', 'no shipped prior')):
            with pytest.raises(ValueError, match=message):
                inferencer(images, prior=prior)
        folder = osp.dirname(images[0])
        with pytest.raises(ValueError, match='need a list of images'):
            inferencer(folder, prior=[random_prior(4)] * 2)
        with pytest.raises(ValueError, match='K=3'):
            inferencer.compare_priors(images[0], None, np.eye(3))
    finally:
        handle.remove()
    assert not calls
    np.testing.assert_array_equal(inferencer.model.get_prior(), before)


def test_compare_priors_draws_the_two_priors_side_by_side(
        inferencer, images, tmp_path):
    prior = random_prior(5)
    result = inferencer.compare_priors(
        images[0],
        None,
        prior,
        titles=['checkpoint', 'site'],
        pred_score_thr=0.3,
        out_dir=str(tmp_path))
    (first, second), = result['predictions']
    assert_close(first, predict(inferencer, images[0])[0])
    assert_close(second, predict(inferencer, images[0], prior=prior)[0])
    height, width = mmcv.imread(images[0]).shape[:2]
    canvas, = result['visualization']
    assert canvas.shape[0] > height and canvas.shape[1] > 2 * width
    assert result['files'] == [
        str(tmp_path / 'compare' / (osp.basename(images[0])[:-4] + '.png'))
    ]
    written = mmcv.imread(result['files'][0], channel_order='rgb')
    np.testing.assert_array_equal(written, canvas)
    # the classes whose count of detections >= 0.3 differs, counted here,
    # are listed
    changes, = result['changes']
    classes = inferencer.model.dataset_meta['classes']

    def counts(pred):
        keep = pred.pred_instances.scores >= 0.3
        return Counter(pred.pred_instances.labels[keep].tolist())

    a, b = counts(first), counts(second)
    expected = [(classes[k], a[k], b[k]) for k in {*a, *b} if a[k] != b[k]]
    assert sorted((c['class_name'], c['count'], c['other_count'])
                  for c in changes
                  if c['count'] != c['other_count']) == sorted(expected)
    # a class of the same count is listed for a box or a score that moved
    assert all(c['count'] != c['other_count'] or c['paired'] < c['count']
               or c['rescored'] for c in changes)
    moves = [abs(c['other_count'] - c['count']) for c in changes]
    assert moves == sorted(moves, reverse=True)  # the largest change first


def test_prior_changes_counts_detections_per_class():
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    from mmcalidet.apis.inferencer import describe_changes

    def sample(labels, scores):
        pred = DetDataSample()
        # one box per detection, none overlapping: each is its own
        boxes = torch.tensor([[10. * i, 0, 10. * i + 5, 5]
                              for i in range(len(labels))])
        pred.pred_instances = InstanceData(
            labels=torch.tensor(labels),
            scores=torch.tensor(scores),
            bboxes=boxes)
        return pred

    first = sample([0, 0, 1, 2], [0.9, 0.5, 0.8, 0.1])
    second = sample([0, 1, 1, 2], [0.9, 0.8, 0.4, 0.2])
    changes = prior_changes(first, second, ['person', 'bicycle', 'car'], 0.3)
    assert [(c['class_name'], c['count'], c['other_count'], c['paired'])
            for c in changes] == [('bicycle', 1, 2, 1), ('person', 2, 1, 1)]
    # the third box is a bicycle in both, its score moved 0.8 -> 0.4
    assert describe_changes(changes, 0.3) == \
        'changed at score >= 0.3: bicycle 1 -> 2 (1 paired; 1 rescored ' \
        'by up to 0.4), person 2 -> 1 (1 paired)'
    assert prior_changes(first, first, ['a', 'b', 'c'], 0.3) == []
    assert 'same 3 detections' in describe_changes([], 0.3, 3)


def test_fit_text_shrinks_then_shortens():
    from mmcalidet.apis.inferencer import fit_text
    assert fit_text('short', 500, 12) == (12, 'short')
    size, text = fit_text('x' * 60, 500, 12)
    assert 8 <= size < 12 and text == 'x' * 60
    size, text = fit_text('x' * 200, 500, 12)
    assert size == 8 and text.endswith('...') and len(text) < 200


@pytest.mark.parametrize('name', ['classes20', 'plain_dino', 'nan_prior'])
def test_inferencer_refuses_a_checkpoint_that_does_not_fit(
        config, bad_checkpoints, name):
    path, error, message = bad_checkpoints[name]
    with pytest.raises(error) as info:
        CaliDetInferencer(config, path, device='cpu', show_progress=False)
    assert str(info.value).startswith(f'checkpoint {path} {message}')
