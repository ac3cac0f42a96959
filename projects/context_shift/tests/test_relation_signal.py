# Copyright (c) mmcalidet contributors. All rights reserved.
"""The relation-term candidate and its measurements: the learned term
starts off (V' alone, bit for bit), moves a class by the evidence of the
others and follows a permutation of the classes; the headroom oracles and
the evidence signal recover a planted relation and find none in noise."""
import numpy as np
import pytest
import torch

from projects.context_shift.context_shift.evidence_signal import (
    fit_presence, mode_value, relation_evidence)
from projects.context_shift.context_shift.headroom import (
    BiasCorrection, RelationCorrection, fit_bias, fit_relation)

K = 4


@pytest.fixture(scope='module')
def head():
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import mmcalidet  # noqa: F401
    from projects.context_shift.experiments.relation_term import \
        relation_term  # noqa: F401
    init_default_scope('mmdet')
    torch.manual_seed(0)
    head = MODELS.build(
        dict(
            type='RelationCaliDINOHead',
            num_classes=K,
            embed_dims=16,
            califormer=dict(
                type='RelationCaliFormer',
                num_layers=1,
                num_heads=2,
                feedforward_channels=32,
                relation_rank=8),
            rho=0.2,
            loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0,
                          alpha=0.25, loss_weight=1.0),
            loss_loma=None))
    head.init_weights()
    return head.eval()


def _calibrated(head, scores, hidden, cali):
    # the plain calibrated head's rho V'^T h, without the relation term
    from mmcalidet.models.dense_heads.calibrated_cls import \
        CalibratedClsMixin
    return CalibratedClsMixin.calibrate_cls_scores(head, scores, hidden, cali)


def test_the_term_starts_off(head):
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, K, generator=gen)
    hidden = torch.randn(2, 3, 5, 16, generator=gen)
    cali = torch.randn(K, 16, generator=gen)
    assert torch.equal(
        head.calibrate_cls_scores(scores, hidden, cali),
        _calibrated(head, scores, hidden, cali))


def test_the_term_moves_a_class_by_the_others_evidence(head):
    former = head.califormer
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 2, 5, 16, generator=gen)
    cali = torch.randn(2, K, 16, generator=gen)
    scores = torch.full((1, 2, 5, K), -8.0)
    scores[0, 0, 0, 1] = 8.0  # image 0 shows class 1, image 1 nothing
    with torch.no_grad():
        former.relation_scale.fill_(1.0)
    try:
        shift = head.calibrate_cls_scores(scores, hidden, cali) - \
            _calibrated(head, scores, hidden, cali)
        weights = former.pair_weights(cali)
        # the same shift for every query of an image
        assert torch.allclose(shift[0, 0], shift[0, 0, :1].expand(5, -1))
        # image 0: class i moves by a_i1 e_1 / (1 + e_1) (e_1 ~ 1)
        expected = weights[0, :, 1] * torch.sigmoid(torch.tensor(8.0)) / (
            1 + torch.sigmoid(torch.tensor(8.0)))
        torch.testing.assert_close(
            shift[0, 0, 0], expected, atol=1e-3, rtol=1e-3)
        assert shift[0, 1].abs().max() < 1e-2  # nothing shown, no shift
        # permuting the classes of V' and of the scores permutes the shift
        order = torch.tensor([2, 0, 3, 1])
        permuted = head.calibrate_cls_scores(
            scores[..., order], hidden, cali[:, order]) - _calibrated(
                head, scores[..., order], hidden, cali[:, order])
        torch.testing.assert_close(permuted, shift[..., order])
    finally:
        with torch.no_grad():
            former.relation_scale.zero_()


def test_relation_evidence_is_the_cooccurrence_form():
    rng = np.random.default_rng(0)
    prior = rng.uniform(0.1, 0.9, (K, K))
    np.fill_diagonal(prior, 1)
    e_t = np.full((K, K), 0.5)
    np.fill_diagonal(e_t, 1)
    evidence = rng.uniform(0, 1, (3, K))
    s = relation_evidence(prior, e_t, evidence)
    for n in range(3):
        for i in range(K):
            num = sum((np.log(prior[i, j] / (1 - prior[i, j])) - 0) *
                      evidence[n, j] for j in range(K) if j != i)
            den = 1 + sum(evidence[n, j] for j in range(K) if j != i)
            assert s[n, i] == pytest.approx(num / den)


def _planted(num=400, seed=0):
    """Images where class 1 comes with class 0 (weak own evidence for
    class 1) and the others at random."""
    rng = np.random.default_rng(seed)
    present = rng.uniform(size=(num, K)) < 0.3
    present[:, 1] = present[:, 0] & (rng.uniform(size=num) < 0.9)
    best = np.where(present, 1.0, -1.0) + rng.normal(0, 1.5, (num, K))
    best[:, 0] = np.where(present[:, 0], 4.0, -4.0)
    return best, 1 / (1 + np.exp(-best)), present


def test_the_evidence_signal_finds_a_planted_relation_and_not_noise():
    best, evidence, present = _planted()
    fit = fit_presence(best, present)
    e_t = np.full((K, K), 0.5)
    np.fill_diagonal(e_t, 1)
    told = e_t.copy()
    told[1, 0] = 0.95  # the prior says: class 1 comes with class 0
    idx = np.arange(len(best))
    pairs = [(told, idx[i:i + 4]) for i in range(0, len(idx), 4)]
    found = mode_value(pairs, best, evidence, present, e_t, fit)
    assert found['value'] > 5 and found['beta'] > 0
    blank = mode_value([(e_t, p) for _, p in pairs], best, evidence,
                       present, e_t, fit)
    assert blank['value'] == pytest.approx(0.0)


def test_the_relation_oracle_recovers_a_planted_relation():
    best, _, present = _planted()
    logits = torch.tensor(best, dtype=torch.float32)[:, None, :]
    labels = [np.flatnonzero(p) for p in present]
    weights, _ = fit_relation(logits, labels)
    assert weights[1, 0] > 0.5  # class 0's evidence raises class 1
    assert abs(weights[1, 0]) > 3 * np.abs(np.delete(weights[1], [0, 1])).max()
    assert np.all(np.diag(weights) == 0)
    shifted = RelationCorrection(weights, np.zeros(K))(logits)
    assert shifted.shape == logits.shape
    moved = BiasCorrection(np.arange(K))(logits) - logits
    assert torch.equal(moved[0, 0], torch.arange(K, dtype=torch.float32))


def test_the_bias_oracle_climbs_its_objective():
    target = np.array([0.5, -1.0, 0.0, 2.0])

    def ap(bias):
        return -np.abs(bias - target).sum()

    bias, best = fit_bias(ap, K)
    np.testing.assert_allclose(bias, target)
    assert best == 0
