# Copyright (c) mmcalidet contributors. All rights reserved.
"""The protocol on a cached tiny CaliDINO (random weights: contracts only,
not accuracy): prior table, subsets, sites, self-calibration, online
calibration with model.test_step.

The head's scores are set to known values (``set_known_scores``): classes
1 and 2 score 0.9-0.98 on every query, the others below 0.01, so every
image predicts exactly {1, 2} and self-calibration moves E_c by amounts
the tests compute by hand."""
import inspect
import json
import os.path as osp

import numpy as np
import pytest
import torch

from mmcalidet.calibration import (DEFAULT_TRUST_RADIUS, OnlineSelfCalibrator,
                                   calibration_step, prediction_statistics,
                                   self_calibrate, self_calibrate_partitions)
from mmcalidet.evaluation import (METRICS, Rescorer, build_priors,
                                  cache_evaluator, calibration_subsets,
                                  evaluate_groups, evaluate_partitions,
                                  evaluate_priors, evaluate_subsets,
                                  is_calibratable, read_image_groups,
                                  site_priors, split_subsets)
from mmcalidet.evaluation.sweep import Method
from mmcalidet.priors import batch_prior, prior_mae
from testing import get_config, known_scores_setup
from testing.tolerances import assert_same_rows

K = 80
#: the classes every image predicts (see set_known_scores)
PREDICTED = (1, 2)


@pytest.fixture(scope='module')
def setup():
    model, loader, cache, evaluator = known_scores_setup(PREDICTED)
    assert is_calibratable(model)
    return model, loader, cache, evaluator


def test_self_calibration_follows_algorithm_1(setup):
    model, _, cache, _ = setup
    e_t = model.get_prior()
    seen = []

    def evaluate(preds):
        seen.append(preds)
        return dict(AP=float(len(seen)))

    result = self_calibrate(
        model,
        cache,
        eta=4.0,
        iters=3,
        score_thr=0.5,
        tol=0.0,
        evaluate=evaluate,
        trust_radius=None)
    # by hand: predictions under E_c, statistics, update
    rescorer = Rescorer(model, cache)
    prior, priors = e_t, [e_t]
    for _ in range(3):
        stats, z = prediction_statistics(rescorer.predict(prior), K, 0.5)
        prior = calibration_step(prior, stats, z.mean(0), 4.0)
        priors.append(prior)
    np.testing.assert_allclose(result.prior, prior)
    assert [h['iter'] for h in result.history] == [0, 1, 2, 3]
    assert [h['AP'] for h in result.history] == [1.0, 2.0, 3.0, 4.0]
    for it, h in enumerate(result.history):
        # evaluated on the predictions under the E_c of that iteration
        expect = rescorer.predict(priors[it])
        assert all(
            torch.equal(a.scores, b.scores) for a, b in zip(seen[it], expect))
        if it:
            step = np.abs(priors[it] - priors[it - 1])
            assert h['step_mae'] == pytest.approx(step.mean())
            assert h['step_max'] == pytest.approx(step.max())
    assert result.history[0]['step_max'] == 0.0
    # every image predicts exactly classes 1 and 2 (scores >= 0.9): E_i's
    # columns 1 and 2 are the indicator of {1, 2}, Z is 0 in every other
    # column, so only columns 1 and 2 move; eta * Z >= 4 * 0.9 > 1 takes
    # them past E_i, and the clip lands them on it
    for preds in seen:
        for pred in preds:
            present = set(pred.labels[pred.scores >= 0.5].tolist())
            assert present == set(PREDICTED)
    indicator = np.isin(np.arange(K), PREDICTED).astype(float)
    for it in (1, 2, 3):
        moved = priors[it]
        others = np.setdiff1d(np.arange(K), PREDICTED)
        np.testing.assert_array_equal(moved[:, others], e_t[:, others])
        for j in PREDICTED:
            np.testing.assert_array_equal(moved[:, j], indicator)
    assert result.history[1]['step_max'] == pytest.approx(
        np.abs(priors[1] - e_t).max())
    assert result.history[1]['step_max'] > 0.5  # the prior moved
    # the estimate before any feedback: E_i under E_t where predicted,
    # E_t's own columns elsewhere (here what the clipped update reached)
    np.testing.assert_array_equal(result.start_estimate, priors[1])
    # ... from the predictions under E_t
    assert all(
        torch.equal(a.scores, b.scores)
        for a, b in zip(result.start_predictions, seen[0]))
    assert np.all(np.diagonal(result.prior) == 1)
    assert result.prior.min() >= 0 and result.prior.max() <= 1
    np.testing.assert_array_equal(model.get_prior(), e_t)  # untouched
    # early stop: any step is below a huge tolerance
    stopped = self_calibrate(model, cache, iters=10, tol=2.0)
    assert stopped.converged and len(stopped.history) == 2
    # AP only every other iteration (and at the last)
    sparse = self_calibrate(
        model,
        cache,
        iters=3,
        tol=0.0,
        evaluate=lambda p: dict(AP=0.5),
        eval_interval=2)
    assert ['AP' in h for h in sparse.history] == [True, False, True, True]


def test_a_trust_region_keeps_self_calibration_near_e_t(setup):
    model, _, cache, _ = setup
    e_t = model.get_prior()
    free = self_calibrate(
        model, cache, iters=3, score_thr=0.5, tol=0.0, trust_radius=None)
    # two columns of 80 move (to the indicator of the predicted classes)
    free_distance = np.abs(free.prior - e_t).mean()
    assert free_distance > 1e-3
    radius = free_distance / 2
    held = self_calibrate(
        model, cache, iters=3, score_thr=0.5, tol=0.0, trust_radius=radius)
    # by hand: each update pulled back along its way from E_t
    rescorer = Rescorer(model, cache)
    prior = e_t
    for _ in range(3):
        stats, z = prediction_statistics(rescorer.predict(prior), K, 0.5)
        new = calibration_step(prior, stats, z.mean(0), 4.0)
        distance = np.abs(new - e_t).mean()
        if distance > radius:
            new = e_t + radius / distance * (new - e_t)
            np.fill_diagonal(new, 1.0)
        prior = new
    np.testing.assert_allclose(held.prior, prior)
    assert np.abs(held.prior - e_t).mean() == pytest.approx(radius)
    # radius 0: E_t itself, the detections under E_t
    still = self_calibrate(
        model, cache, iters=2, score_thr=0.5, tol=0.0, trust_radius=0.0)
    np.testing.assert_array_equal(still.prior, e_t)
    with pytest.raises(ValueError, match='trust_radius'):
        self_calibrate(model, cache, trust_radius=-0.1)
    # by default within DEFAULT_TRUST_RADIUS of E_t
    assert inspect.signature(self_calibrate).parameters[
        'trust_radius'].default == DEFAULT_TRUST_RADIUS
    by_default = self_calibrate(model, cache, iters=3, score_thr=0.5, tol=0.0)
    explicit = self_calibrate(
        model,
        cache,
        iters=3,
        score_thr=0.5,
        tol=0.0,
        trust_radius=DEFAULT_TRUST_RADIUS)
    np.testing.assert_array_equal(by_default.prior, explicit.prior)
    assert np.abs(by_default.prior - e_t).mean() <= DEFAULT_TRUST_RADIUS + 1e-9


def test_prior_table_and_subsets(setup):
    model, _, cache, evaluator = setup
    evaluate = cache_evaluator(evaluator)
    e_t = model.get_prior()
    labels = cache.gt_label_lists()
    specs = build_priors(('E0', 'E_t', 'E_x'), labels, e_t, cache.batch_ids)
    method = Method('CaliDINO', Rescorer(model, cache))
    rows = evaluate_priors([method], specs, evaluate, progress=False)
    assert [(r['prior'], r['oracle']) for r in rows] == [('E0', False),
                                                         ('E_t', False),
                                                         ('E_x', True)]
    expect = evaluate(cache, method.rescorer.predict(e_t))
    assert {m: rows[1][m] for m in METRICS} == expect

    rows = evaluate_subsets([method],
                            evaluate,
                            e_t,
                            sizes=(2, 8),
                            seed=1,
                            progress=False)
    assert [(r['size'], r['prior']) for r in rows] == [(2, 'E_t'), (2, 'E_b')]
    subsets = split_subsets(4, 2, seed=1)
    eps = np.mean([
        prior_mae(batch_prior(K, [labels[i] for i in idx]), e_t)
        for idx in subsets
    ])
    assert rows[1]['epsilon'] == pytest.approx(eps)
    # each subset is evaluated on its own images, then averaged
    preds = method.rescorer.predict(e_t)
    per = [evaluate(cache, [preds[i] for i in idx], idx) for idx in subsets]
    assert rows[0]['AP'] == pytest.approx(
        np.nanmean([p['AP'] for p in per]), nan_ok=True)
    assert rows[1]['gain_AP'] == pytest.approx(
        rows[1]['AP'] - rows[0]['AP'], nan_ok=True)


def test_self_calibrate_subsets(setup):
    model, _, cache, evaluator = setup
    subsets = calibration_subsets(len(cache), 2, num_images=4, seed=0)
    assert [list(s) for s in subsets] == [
        list(s) for s in split_subsets(4, 2, seed=0)
    ]
    out = self_calibrate_partitions(
        model,
        cache,
        subsets,
        evaluate=cache_evaluator(evaluator),
        progress=False,
        iters=2,
        tol=0.0)
    assert len(out['subsets']) == 2 and len(out['results']) == 2
    assert [m['iter'] for m in out['mean']] == [0, 1, 2]
    assert out['mean'][2]['step_max'] == pytest.approx(
        np.mean([r.history[2]['step_max'] for r in out['results']]))
    with pytest.raises(ValueError, match='no subset'):
        calibration_subsets(len(cache), 8)
    assert [list(s) for s in calibration_subsets(4, 0, num_images=3)] == [
        [0, 1, 2]
    ]


def online_reference(prior, image_scores, momentum, eta, interval,
                     score_thr):
    """E_c after each update of the online calibrator, written out from
    its definition (mmcalidet/calibration/online.py): per image ``p`` (the
    predicted classes) and ``z`` (their max scores), ``C <- m C + p p^T``,
    ``n <- m n + p``, ``s <- m s + z``, ``w <- m w + 1``; every
    ``interval`` images ``E_i = C / n`` (0.5 where ``n`` = 0, diagonal 1)
    and ``E_c <- clip(E_c + eta * Z * (E_i - E_c), 0, 1)`` with ``Z[:, j]
    = s_j / w``, diagonal 1."""
    pairs, counts, score_sum, weight = np.zeros((K, K)), np.zeros(K), \
        np.zeros(K), 0.0
    out = []
    for n, (labels, scores) in enumerate(image_scores, 1):
        z = np.zeros(K)
        for label, score in zip(labels, scores):
            if score >= score_thr:
                z[label] = max(z[label], score)
        p = (z > 0).astype(float)
        pairs = momentum * pairs + np.outer(p, p)
        counts = momentum * counts + p
        score_sum = momentum * score_sum + z
        weight = momentum * weight + 1
        if n % interval:
            continue
        stats = np.full((K, K), 0.5)
        seen = counts > 0
        stats[:, seen] = pairs[:, seen] / counts[seen]
        np.fill_diagonal(stats, 1)
        big_z = np.tile(score_sum / weight, (K, 1))
        prior = np.clip(prior + eta * big_z * (stats - prior), 0, 1)
        np.fill_diagonal(prior, 1)
        out.append(prior)
    return out


def test_online_calibrator_composes_with_test_step(setup):
    model, loader, _, _ = setup
    saved = model.get_prior()
    cal = OnlineSelfCalibrator(
        model=model, warmup=2, update_interval=2, eta=0.5, momentum=0.9)
    used = []  # the priors the CaliFormer computes V' of
    hook = model.bbox_head.califormer.register_forward_pre_hook(
        lambda module, args: used.append(args[0].detach().clone()))
    try:
        priors, images = [], []
        with torch.no_grad():
            for batch in loader:  # 2 batches of 2 images
                outputs = model.test_step(batch)
                images += [(o.pred_instances.labels.numpy(),
                            o.pred_instances.scores.numpy()) for o in outputs]
                assert cal.update(outputs)
                priors.append(model.get_prior())
        assert cal.num_updates == 2 and cal.num_images == 4
        expected = online_reference(saved, images, 0.9, 0.5, 2, 0.3)
        for got, want in zip(priors, expected):
            np.testing.assert_allclose(got, want, atol=1e-6)
        # only the predicted classes' columns move, towards E_i = 1 on rows
        # 1 and 2 and 0 elsewhere
        others = np.setdiff1d(np.arange(K), PREDICTED)
        np.testing.assert_allclose(priors[0][:, others], saved[:, others],
                                   atol=1e-6)
        for j in PREDICTED:
            step = priors[0][:, j] - saved[:, j]
            target = np.isin(np.arange(K), PREDICTED) - saved[:, j]
            moves = np.abs(target) > 1e-3
            assert moves.sum() > 40
            assert np.all(step[moves] * target[moves] > 0)
            assert np.all(np.abs(step) <= np.abs(target) + 1e-6)
        # E_c after the first batch was injected and used for the second
        np.testing.assert_allclose(
            used[-1].double().numpy(), priors[0], atol=1e-6)
        np.testing.assert_allclose(model.get_prior(), cal.prior, atol=1e-6)
    finally:
        hook.remove()
        model.set_prior(saved)


def test_self_calibrate_accepts_image_paths(setup, tmp_path):
    model, loader, cache, _ = setup
    model.cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model.cfg.test_dataloader.dataset.pipeline[1].scale = (96, 96)
    paths = [ds.img_path for ds in cache.data_samples[:2]]
    assert all(osp.isfile(p) for p in paths)
    result = self_calibrate(model, paths, iters=1, tol=0.0)
    assert len(result.predictions) == 2 and len(result.history) == 2


def test_prior_table_in_worker_processes(setup):
    model, _, cache, evaluator = setup
    specs = build_priors(('E0', 'E_t'), cache.gt_label_lists(),
                         model.get_prior(), cache.batch_ids)
    method = Method('CaliDINO', Rescorer(model, cache))
    evaluate = cache_evaluator(evaluator)
    serial = evaluate_priors([method], specs, evaluate, progress=False)
    forked = evaluate_priors([method],
                             specs,
                             evaluate,
                             progress=False,
                             workers=2)
    for a, b in zip(serial, forked):
        a.pop('seconds'), b.pop('seconds')
        np.testing.assert_equal(a, b)  # nan == nan here


def test_site_table_matches_per_site_evaluation(setup):
    model, _, cache, evaluator = setup
    evaluate = cache_evaluator(evaluator)
    e_t = model.get_prior()
    labels = cache.gt_label_lists()
    method = Method('CaliDINO', Rescorer(model, cache))
    groups = ['b', 'a', 'b', 'a']
    rows = evaluate_groups([method], evaluate, e_t, groups, order=['a', 'b'])
    assert [(r['site'], r['prior'], r['num_images']) for r in rows] == [
        ('a', 'E_t', 2), ('a', 'E_site', 2), ('b', 'E_t', 2),
        ('b', 'E_site', 2)
    ]
    for site, idx in (('a', [1, 3]), ('b', [0, 2])):
        e_site = batch_prior(K, [labels[i] for i in idx])
        base, own = [r for r in rows if r['site'] == site]
        assert base['epsilon'] == pytest.approx(prior_mae(e_site, e_t))
        expect_t = evaluate(cache, method.rescorer.predict(e_t, idx), idx)
        expect_s = evaluate(cache, method.rescorer.predict(e_site, idx), idx)
        assert {m: base[m] for m in METRICS} == expect_t
        assert {m: own[m] for m in METRICS} == expect_s
        assert own['gain_AP'] == pytest.approx(
            own['AP'] - base['AP'], nan_ok=True)
    # the site priors a caller needs too (plots, self-calibration) are the
    # ones the table used, and passing them gives the same table
    priors = site_priors(labels, groups, K, order=['a', 'b'])
    assert list(priors) == ['a', 'b']
    np.testing.assert_array_equal(priors['a'],
                                  batch_prior(K, [labels[1], labels[3]]))
    given = evaluate_groups([method], evaluate, e_t, groups, ['a', 'b'],
                            priors)
    for a, b in zip(rows, given):
        a.pop('seconds', None), b.pop('seconds', None)
        np.testing.assert_equal(a, b)
    # a prior that is not the site's is the one scored (and measured)
    swapped = evaluate_groups([method], evaluate, e_t, groups, ['a', 'b'],
                              dict(a=priors['b'], b=priors['a']))
    assert {m: swapped[0][m] for m in METRICS} == \
        {m: rows[0][m] for m in METRICS}
    assert {m: swapped[1][m] for m in METRICS} == evaluate(
        cache, method.rescorer.predict(priors['b'], [1, 3]), [1, 3])
    assert swapped[0]['epsilon'] == pytest.approx(
        prior_mae(priors['b'], e_t))
    with pytest.raises(ValueError, match="no prior for site 'b'"):
        evaluate_groups([method], evaluate, e_t, groups, ['a', 'b'],
                        dict(a=priors['a']))
    with pytest.raises(ValueError, match='3 group labels for 4'):
        evaluate_groups([method], evaluate, e_t, groups[:3])
    with pytest.raises(ValueError, match='missing from order'):
        evaluate_groups([method], evaluate, e_t, groups, order=['a'])


def test_partitions_score_e_t_once_or_per_partition(setup):
    model, _, cache, evaluator = setup
    evaluate = cache_evaluator(evaluator)
    e_t = model.get_prior()
    labels = cache.gt_label_lists()
    # re-scoring batches of 3 straddle the partitions
    method = Method('CaliDINO', Rescorer(model, cache, batch_size=3))
    parts = [np.array([0, 2]), np.array([3, 1])]
    per = evaluate_partitions([method], evaluate, e_t, parts)
    base = {}
    once = evaluate_partitions([method], evaluate, e_t, parts, base)
    assert len(base['CaliDINO']) == len(cache)
    with pytest.raises(ValueError, match='1 priors for 2 partitions'):
        evaluate_partitions([method], evaluate, e_t, parts, priors=[e_t])
    assert [(r['index'], r['num_images']) for r in per] == [(0, 2), (1, 2)]
    for a, b, idx in zip(per, once, parts):
        a.pop('seconds'), b.pop('seconds')
        # E_t scored in other batches: AP within the tight tolerance
        assert_same_rows(a, b)  # nan == nan here
        own = batch_prior(K, [labels[i] for i in idx])
        assert a['epsilon'] == pytest.approx(prior_mae(own, e_t))
        assert a['own'] == evaluate(cache, method.rescorer.predict(own, idx),
                                    idx)


def test_read_image_groups(tmp_path):
    ann = tmp_path / 'val.json'
    ann.write_text(
        json.dumps(
            dict(
                images=[dict(id=1, site='x'),
                        dict(id=2, site='y')],
                annotations=[],
                categories=[])))
    assert read_image_groups(str(ann), [2, 1]) == ['y', 'x']
    with pytest.raises(ValueError, match='no image with id 3'):
        read_image_groups(str(ann), [3])
    with pytest.raises(ValueError, match="has no 'scene' field"):
        read_image_groups(str(ann), [1], key='scene')
    ann.write_text(json.dumps(dict(images=[], annotations=[])))
    with pytest.raises(ValueError, match='no images'):
        read_image_groups(str(ann), [1])
