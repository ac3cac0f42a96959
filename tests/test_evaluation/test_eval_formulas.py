# Copyright (c) mmcalidet contributors. All rights reserved.
"""Model-free pieces of the protocol: subsets, epsilon, the prior table,
the self-calibration update, the online calibrator, post-hoc baselines."""
import numpy as np
import pytest
import torch
from mmengine.structures import InstanceData

from mmcalidet.calibration import (DEFAULT_TRUST_RADIUS, OnlineSelfCalibrator,
                                   calibration_step, mean_history,
                                   prediction_statistics, update_target)
from mmcalidet.evaluation import (PriorReweighting, build_priors,
                                  check_expected_order, format_order_verdict,
                                  split_subsets, subset_epsilon)
from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                            build_correction,
                                            class_frequencies)
from mmcalidet.priors import (batch_prior, flat_prior, flip_prior, prior_mae,
                              sample_prior)

K = 5


def pred(labels, scores):
    return InstanceData(
        labels=torch.tensor(labels, dtype=torch.long),
        scores=torch.tensor(scores, dtype=torch.float32),
        bboxes=torch.zeros(len(labels), 4))


def test_split_subsets():
    subsets = split_subsets(103, 8, seed=0)
    assert len(subsets) == 12 and all(len(s) == 8 for s in subsets)
    flat = np.concatenate(subsets)
    assert len(set(flat.tolist())) == 96  # non-overlapping
    assert np.array_equal(flat, np.random.default_rng(0).permutation(103)[:96])
    assert all(
        np.array_equal(a, b)
        for a, b in zip(subsets, split_subsets(103, 8, seed=0)))
    assert not np.array_equal(flat, np.concatenate(split_subsets(103, 8, 1)))
    assert split_subsets(5, 8) == []
    with pytest.raises(ValueError):
        split_subsets(5, 0)


def test_subset_epsilon_is_mean_mae():
    rng = np.random.default_rng(0)
    labels = [
        rng.choice(K, rng.integers(0, 3), replace=False) for _ in range(20)
    ]
    e_t = batch_prior(K, labels[:10])
    rows = subset_epsilon(labels, e_t, sizes=(4, 32), seed=3)
    expect = np.mean([
        prior_mae(batch_prior(K, [labels[i] for i in idx]), e_t)
        for idx in split_subsets(20, 4, 3)
    ])
    assert rows[0] == pytest.approx(
        dict(
            size=4,
            num_subsets=5,
            epsilon=expect,
            epsilon_std=rows[0]['epsilon_std']))
    assert rows[1]['num_subsets'] == 0 and np.isnan(rows[1]['epsilon'])


def test_build_priors():
    labels = [
        np.array([0, 1]),
        np.array([2]),
        np.array([], np.int64),
        np.array([1, 3])
    ]
    e_t = batch_prior(K, labels[:2])
    specs = {
        s.key: s
        for s in build_priors(('flip_E_x', 'E0', 'E_t', 'E_v', 'E_b', 'E_x'),
                              labels,
                              e_t,
                              batch_ids=[0, 0, 1, 1])
    }
    assert [s.oracle
            for s in specs.values()] == [True, False, False, True, True, True]
    np.testing.assert_array_equal(specs['E0'].prior, flat_prior(K))
    np.testing.assert_array_equal(specs['E_t'].prior, e_t)
    np.testing.assert_array_equal(specs['E_v'].prior, batch_prior(K, labels))
    idx = np.array([3, 0])
    np.testing.assert_array_equal(
        specs['E_x'].prior(idx),
        np.stack([sample_prior(K, labels[3]),
                  sample_prior(K, labels[0])]))
    np.testing.assert_array_equal(
        specs['flip_E_x'].prior(idx),
        np.stack([flip_prior(sample_prior(K, labels[k])) for k in idx]))
    eb = specs['E_b'].prior(np.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(eb[0], batch_prior(K, labels[:2]))
    np.testing.assert_array_equal(eb[1], eb[0])
    np.testing.assert_array_equal(eb[3], batch_prior(K, labels[2:]))
    with pytest.raises(ValueError, match='unknown prior'):
        build_priors(['E_q'], labels, e_t)


def test_filled_priors_keep_the_content_not_the_presence():
    labels = [np.array([0, 1]), np.array([2])]
    e_t = np.full((K, K), 0.3)
    np.fill_diagonal(e_t, 1.0)
    specs = {
        s.key: s
        for s in build_priors(('filled_flip_E_x', 'E_t', 'filled_E_x'),
                              labels, e_t)
    }
    assert specs['filled_E_x'].label == 'filled E_x'
    assert specs['filled_E_x'].oracle and specs['filled_flip_E_x'].oracle
    filled = specs['filled_E_x'].prior(np.array([0]))[0]
    flipped = specs['filled_flip_E_x'].prior(np.array([0]))[0]
    e_x = sample_prior(K, labels[0])
    # the present classes' columns are E_x's (flipped: 1 - E_x) ...
    np.testing.assert_array_equal(filled[:, [0, 1]], e_x[:, [0, 1]])
    off = ~np.eye(K, dtype=bool)[:, [0, 1]]
    np.testing.assert_array_equal(flipped[:, [0, 1]][off],
                                  1 - e_x[:, [0, 1]][off])
    # ... the others E_t's: no 0.5 columns marking absent classes
    for prior in (filled, flipped):
        np.testing.assert_array_equal(prior[:, 2:], e_t[:, 2:])
        assert (np.diag(prior) == 1).all()


def test_check_expected_order():

    def rows(aps, method='m'):
        keys = ('flip_E_x', 'E0', 'E_t', 'E_v', 'E_b', 'E_x')
        return [dict(method=method, key=k, AP=a) for k, a in zip(keys, aps)]

    ok = check_expected_order(rows([.1, .2, .3, .3, .4, .5]), 'm')
    assert ok['holds'] is True and ok['violations'] == []
    assert ok['verdict'] == 'holds'
    assert ok['spread'] == pytest.approx(.4)
    assert format_order_verdict(ok) == 'holds (spread 40.00)'
    bad = check_expected_order(
        rows([.1, .2, .31, .3, .4, .5]) + rows([.9] * 6, 'other'), 'm')
    assert bad['holds'] is False and bad['verdict'] == 'does not hold'
    assert bad['violations'] == ['E_t > E_v (31.00 > 30.00)']
    assert format_order_verdict(bad) == \
        'does not hold: E_t > E_v (31.00 > 30.00)'
    one = check_expected_order(rows([.1]), 'm')
    assert one['holds'] is None
    assert one['verdict'] == 'undecidable (fewer than two priors evaluated)'


def test_check_expected_order_ties_and_tolerance():

    def rows(aps):
        keys = ('flip_E_x', 'E0', 'E_t', 'E_v', 'E_b', 'E_x')
        return [dict(method='m', key=k, AP=a) for k, a in zip(keys, aps)]

    # an untrained model: every AP 0.00 is no evidence of the order
    zero = check_expected_order(rows([0.] * 6), 'm')
    assert zero['holds'] is None and zero['violations'] == []
    assert zero['verdict'] == ('undecidable (all APs within 0.00 of each '
                               'other: spread 0.00)')
    assert format_order_verdict(zero) == zero['verdict']
    # a spread within the tolerance (0.25 AP points) is undecidable too
    small = rows([.100, .101, .101, .102, .102, .102])
    assert check_expected_order(small, 'm')['holds'] is True
    tied = check_expected_order(small, 'm', tol=.0025)
    assert tied['holds'] is None
    assert tied['verdict'].startswith('undecidable (all APs within 0.25 ')
    # drops within the tolerance are ties; larger ones are violations
    rough = rows([.10, .12, .115, .13, .14, .16])
    assert check_expected_order(rough, 'm')['holds'] is False
    assert check_expected_order(rough, 'm', tol=.01)['holds'] is True
    # no effect: each step within the tolerance, the end not above the start
    creep = rows([.100, .105, .110, .106, .102, .100])
    res = check_expected_order(creep, 'm', tol=.005)
    assert res['holds'] is False
    assert res['violations'] == [
        'E_x - flip(E_x) = +0.00, not above the tolerance 0.50'
    ]
    assert check_expected_order(rows([.1, float('nan')]), 'm')['holds'] \
        is None
    with pytest.raises(ValueError, match='tol must be >= 0'):
        check_expected_order(small, 'm', tol=-1)


def test_prediction_statistics():
    preds = [
        pred([0, 0, 2, 3], [0.9, 0.5, 0.4, 0.1]),  # 3 below threshold
        pred([], []),
        pred([2, 4], [0.8, float('nan')]),
    ]
    stats, z = prediction_statistics(preds, K, score_thr=0.3)
    np.testing.assert_allclose(
        z, [[0.9, 0, 0.4, 0, 0], [0] * 5, [0, 0, 0.8, 0, 0]], atol=1e-6)
    np.testing.assert_array_equal(stats, batch_prior(K, [[0, 2], [], [2]]))
    with pytest.raises(ValueError, match='labels must lie'):
        prediction_statistics([pred([7], [0.9])], K, 0.3)


def _prior_and_statistics(seed):
    """A valid E_c and a random E_i."""
    prior = sample_prior(K, [0, 1]) * 0.8 + 0.1
    np.fill_diagonal(prior, 1)
    return prior, np.random.default_rng(seed).uniform(size=(K, K))


def test_calibration_step_formula():
    prior, stats = _prior_and_statistics(0)
    z = np.array([0.0, 0.5, 0.1, 1.0, 0.2])
    new = calibration_step(prior, stats, z, eta=4.0)
    expect = np.clip(prior + 4.0 * z[None, :] * (stats - prior), 0, 1)
    np.fill_diagonal(expect, 1)
    np.testing.assert_allclose(new, expect)
    assert np.array_equal(new[:, 0], prior[:, 0])  # z = 0: column kept
    assert new.min() >= 0 and new.max() <= 1  # eta * z = 4 overshoots
    assert np.any(expect != prior + 4.0 * z[None, :] * (stats - prior))


def test_update_target_is_where_the_step_goes():
    prior, stats = _prior_and_statistics(1)
    z = np.array([0.0, 0.5, 0.1, 0.0, 0.2])
    target = update_target(prior, stats, z)
    np.testing.assert_array_equal(target[:, [0, 3]], prior[:, [0, 3]])
    off = ~np.eye(K, dtype=bool)
    seen = np.zeros((K, K), bool)
    seen[:, [1, 2, 4]] = True
    np.testing.assert_array_equal(target[off & seen], stats[off & seen])
    assert np.all(np.diagonal(target) == 1)
    # a full step (eta * z = 1 in every predicted column) lands on it
    np.testing.assert_allclose(
        calibration_step(prior, stats, z, eta=1.0 / 0.5)[:, 1], target[:, 1])


def test_mean_history_carries_early_stops():
    a = [dict(iter=0, AP=0.1, step_max=0.), dict(iter=1, AP=0.3, step_max=0.2)]
    b = [dict(iter=0, AP=0.3, step_max=0.)]
    mean = mean_history([a, b])
    assert [m['AP'] for m in mean] == pytest.approx([0.2, 0.3])
    assert mean[1]['num_runs'] == 2


class FakeModel:

    def __init__(self, prior):
        self.prior = prior
        self.injected = []

    def get_prior(self):
        return self.prior.copy()

    def set_prior(self, prior):
        self.prior = np.asarray(prior)
        self.injected.append(self.prior.copy())


def test_online_zero_predictions_keep_prior_valid():
    e_t = flat_prior(K)
    e_t[1, 0] = 0.9
    model = FakeModel(e_t)
    cal = OnlineSelfCalibrator(
        model=model, num_classes=K, warmup=0, update_interval=1)
    for _ in range(5):
        assert cal.update([pred([], [])])
        assert np.isfinite(cal.prior).all()
        assert cal.prior.min() >= 0 and cal.prior.max() <= 1
        assert np.all(np.diagonal(cal.prior) == 1)
    np.testing.assert_array_equal(cal.prior, e_t)  # nothing to learn
    assert cal.last_step == dict(step_mae=0.0, step_max=0.0)
    assert len(model.injected) == 6  # construction + 5 updates


def test_online_running_statistics_and_update():
    e_t = flat_prior(K)
    model = FakeModel(e_t)
    cal = OnlineSelfCalibrator(
        model=model,
        eta=1.0,
        momentum=0.5,
        score_thr=0.3,
        update_interval=2,
        warmup=4,
        trust_radius=None)  # the update itself
    stream = [
        pred([0, 1], [0.9, 0.6]),
        pred([0], [0.8]),
        pred([1, 2], [0.7, 0.2]),
        pred([3], [0.5])
    ]
    updated = [cal.update(p) for p in stream]
    assert updated == [False, False, False, True]  # after warmup 4
    # the running statistics, by hand (m = 0.5 per image)
    pres = np.array(
        [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]],
        dtype=float)
    zs = np.array([[.9, .6, 0, 0, 0], [.8, 0, 0, 0, 0], [0, .7, 0, 0, 0],
                   [0, 0, 0, .5, 0]])
    w = 0.5**np.arange(3, -1, -1)
    pair = sum(wk * np.outer(p, p) for wk, p in zip(w, pres))
    cnt = (w[:, None] * pres).sum(0)
    stats = np.full((K, K), 0.5)
    stats[:, cnt > 0] = pair[:, cnt > 0] / cnt[cnt > 0]
    np.fill_diagonal(stats, 1)
    z_mean = (w[:, None] * zs).sum(0) / w.sum()
    run = cal.running_statistics()
    np.testing.assert_allclose(run['stats'], stats)
    np.testing.assert_allclose(run['z_mean'], z_mean, atol=1e-7)
    np.testing.assert_allclose(cal.prior,
                               calibration_step(e_t, stats, z_mean, 1.0))
    np.testing.assert_allclose(model.prior, cal.prior)
    # state round trip
    other = OnlineSelfCalibrator(num_classes=K, init_prior=e_t)
    other.load_state_dict(cal.state_dict())
    np.testing.assert_array_equal(other.prior, cal.prior)
    cal.reset()
    np.testing.assert_array_equal(cal.prior, e_t)
    with pytest.raises(ValueError, match='momentum'):
        OnlineSelfCalibrator(init_prior=e_t, momentum=1.0)
    with pytest.raises(ValueError, match='init_prior'):
        OnlineSelfCalibrator(num_classes=K)


def test_online_trust_radius_bounds_the_distance_from_the_start():
    e_t = flat_prior(K)
    stream = [pred([0, 1], [0.9, 0.8]), pred([0, 1], [0.9, 0.7])] * 4
    free = OnlineSelfCalibrator(
        init_prior=e_t, warmup=0, update_interval=1, trust_radius=None)
    bound = OnlineSelfCalibrator(
        init_prior=e_t, warmup=0, update_interval=1, trust_radius=0.01)
    for p in stream:
        free.update(p)
        bound.update(p)
        # E_c stays within the radius of E_t, diagonal 1
        distance = np.abs(bound.prior - e_t).mean()
        assert distance <= 0.01 + 1e-12
        assert np.all(np.diagonal(bound.prior) == 1)
    assert np.abs(free.prior - e_t).mean() > 0.05
    # the pull keeps the direction of the step: 0 and 1 go together
    assert bound.prior[0, 1] > e_t[0, 1] and bound.prior[1, 0] > e_t[1, 0]
    assert np.abs(bound.prior - e_t).mean() == pytest.approx(0.01)
    with pytest.raises(ValueError, match='trust_radius'):
        OnlineSelfCalibrator(init_prior=e_t, trust_radius=-0.1)
    # by default as bounded as the batch algorithm
    assert OnlineSelfCalibrator(
        init_prior=e_t).trust_radius == DEFAULT_TRUST_RADIUS


def test_posthoc_corrections_identity_at_reference_and_direction():
    rng = np.random.default_rng(0)
    labels = [
        rng.choice(K, rng.integers(1, 4), replace=False) for _ in range(50)
    ]
    e_ref = batch_prior(K, labels)
    freq = np.array([0.5, 0.2, 0.1, 0.3, 0.05])
    logits = torch.randn(2, 7, K)
    for corr in (PriorReweighting(e_ref, freq),
                 CooccurrenceRescoring(e_ref, beta=1.0)):
        torch.testing.assert_close(corr(logits, e_ref), logits)
        per_image = np.stack([e_ref, sample_prior(K, [0, 1])])
        out = corr(logits, per_image)
        assert out.shape == logits.shape
        torch.testing.assert_close(out[0], logits[0])
        assert not torch.allclose(out[1], logits[1])
    # E says class 2 always appears with the others: its scores go up
    boosted = e_ref.copy()
    boosted[2, :] = 1.0
    for corr in (PriorReweighting(e_ref, freq), CooccurrenceRescoring(e_ref)):
        shift = corr(logits, boosted) - logits
        assert torch.all(shift[..., 2] > 0)
    # re-weighting: logit shift = logit(pi_t) - logit(pi_s), per class
    rw = PriorReweighting(e_ref, freq)
    pi_t = rw.target_marginals(torch.as_tensor(boosted, dtype=torch.float32))
    expect = torch.logit(pi_t) - torch.logit(
        torch.as_tensor(freq, dtype=torch.float32))
    torch.testing.assert_close(
        rw(logits, boosted) - logits,
        expect.expand_as(logits),
        atol=1e-5,
        rtol=1e-5)
    with pytest.raises(ValueError, match='sigmoid logits'):
        rw(torch.zeros(1, 3, K + 1), e_ref)
    with pytest.raises(ValueError, match='unknown correction'):
        build_correction('softmax', e_ref)
    with pytest.raises(ValueError, match='class frequencies'):
        build_correction('reweight', e_ref)


def test_class_frequencies():
    from mmcalidet.priors import Prior
    e_t = Prior.load(
        dict(classes=['a', 'b'], matrix=[[1, 0.5], [0.5, 1]],
             images_per_class=dict(a=5, b=0), num_images=10))
    np.testing.assert_allclose(
        class_frequencies(e_t.reorder(['b', 'a'])), [1e-6, 0.5])
    with pytest.raises(ValueError, match='images_per_class'):
        class_frequencies(Prior(np.eye(2), ['a', 'b']))


def test_batch_step_with_zero_predictions_keeps_prior_valid():
    """Algo. 1 on images where nothing is detected (or only below the
    threshold, or with non-finite scores): E_c stays finite, in [0, 1],
    with diagonal 1, and unchanged (Z = 0)."""
    from mmcalidet.calibration import calibration_step, prediction_statistics
    e_c = flat_prior(K)
    e_c[2, 1] = 0.8
    preds = [pred([], []), pred([0], [0.1]), pred([3], [float('nan')])]
    stats, z = prediction_statistics(preds, K, score_thr=0.3)
    np.testing.assert_array_equal(z, 0)
    np.testing.assert_array_equal(stats, flat_prior(K))
    new = calibration_step(e_c, stats, z.mean(0), eta=4.0)
    assert np.isfinite(new).all() and new.min() >= 0 and new.max() <= 1
    np.testing.assert_array_equal(np.diagonal(new), 1)
    np.testing.assert_array_equal(new, e_c)


def test_is_calibratable_needs_the_prior_api_and_a_head_with_v_prime():
    from mmcalidet.apis import is_calibratable as api_is_calibratable
    from mmcalidet.evaluation import is_calibratable
    assert is_calibratable is api_is_calibratable  # one definition

    class Head:

        def get_cali_vectors(self):
            pass

    def model(*drop):
        attrs = dict(
            set_prior=lambda p: None,
            resolve_prior=lambda p: p,
            bbox_head=Head())
        for key in drop:
            attrs.pop(key)
        return type('Model', (), attrs)()

    assert is_calibratable(model())
    for key in ('set_prior', 'resolve_prior', 'bbox_head'):
        assert not is_calibratable(model(key)), key
    plain = model()
    plain.bbox_head = object()  # a head that does not calibrate
    assert not is_calibratable(plain)
