# Copyright (c) mmcalidet contributors. All rights reserved.
"""Split-half site tables (:mod:`mmcalidet.evaluation.split_half`), on
planted sites: COCO files whose images show pairs of classes, scored by a
fake detector whose scores are a known function of the prior and that
records every prior (and support) it is given. No model, no data files."""
import json

import numpy as np
import pytest
from mmengine.structures import InstanceData

from mmcalidet.evaluation import (IN_SAMPLE, SPLIT_HALF, CocoEvaluator,
                                  evaluate_site_halves, paired_bootstrap,
                                  relation_classes, site_halves,
                                  split_half_sweep, split_halves)
from mmcalidet.evaluation.split_half import mean_over_sites, scored_matches
from mmcalidet.evaluation.sweep import Method
from mmcalidet.priors import batch_prior, flat_prior
from testing.fake_cache import FakeCache

K = 4

#: the pairs image i shows: ``shared``, (0, 1) or (2, 3) in both parity
#: halves (the halves' statistics agree); ``crossed``, those in the even
#: half and (0, 2) or (1, 3) in the odd half (they disagree)
PAIRS = dict(
    shared=((0, 1), (0, 1), (2, 3), (2, 3)),
    crossed=((0, 1), (0, 2), (2, 3), (1, 3)))


def planted_site(tmp_path, num, kind, name='site'):
    """``num`` images, image i showing ``PAIRS[kind][i % 4]``: its
    evaluator and images."""
    images, anns, site = [], [], []
    for i in range(num):
        pair = PAIRS[kind][i % 4]
        images.append(
            dict(id=i + 1, width=200, height=100, file_name=f'{i}.jpg'))
        boxes = np.array([[10.0, 10.0, 60.0, 60.0], [110.0, 10.0, 160.0,
                                                     60.0]])
        for box, label in zip(boxes, pair):
            anns.append(
                dict(
                    id=len(anns) + 1,
                    image_id=i + 1,
                    category_id=label + 1,
                    bbox=[box[0], box[1], 50.0, 50.0],
                    area=2500.0,
                    iscrowd=0))
        site.append((i + 1, boxes, np.array(pair)))
    path = tmp_path / f'{name}.json'
    with open(path, 'w') as f:
        json.dump(
            dict(
                images=images,
                annotations=anns,
                categories=[dict(id=k + 1, name=f'c{k}') for k in range(K)]),
            f)
    return CocoEvaluator(str(path), [f'c{k}' for k in range(K)]), site


class RecordingRescorer:
    """Each true box scored by the mean of P(class | j) over the image's
    other classes under the prior, beside a false box of each class the
    image does not show, scored likewise; a seeded per-image jitter
    (``noise``) keeps the images apart. Records each ``predict`` (prior,
    images) and each ``register_support``; reads a support."""

    reads_support, calibratable, correction = True, True, None

    def __init__(self, images, noise=0.1):
        self.cache = FakeCache(images)
        self.noise = noise
        self.predicted, self.registered = [], []
        self._supports = {}

    def register_support(self, prior, support, marginals):
        prior = np.asarray(prior, np.float64)
        self.registered.append(
            (prior, np.asarray(support), np.asarray(marginals)))
        self._supports[prior.astype(
            np.float32).tobytes()] = (np.asarray(support),
                                      np.asarray(marginals))

    def support_of(self, prior):
        return self._supports.get(np.asarray(prior, np.float32).tobytes())

    def predict(self, prior, indices=None):
        prior = np.asarray(prior, np.float64)
        indices = np.arange(len(self.cache)) if indices is None else \
            np.asarray(indices)
        self.predicted.append((prior, indices.copy()))
        out = []
        for i in indices:
            img_id, boxes, labels = self.cache.images[i]
            false = np.array([c for c in range(K) if c not in labels])
            jitter = np.random.default_rng(int(img_id)).uniform(
                -self.noise, self.noise, size=len(labels) + len(false))
            all_labels = np.concatenate([labels, false])
            scores = [
                float(np.mean(prior[c, [j for j in labels if j != c]]))
                for c in all_labels
            ] + jitter
            out.append(
                InstanceData(
                    bboxes=np.concatenate([boxes, boxes[:len(false)] + 3.0
                                           ]).astype(np.float32),
                    scores=np.clip(scores, 0, 1).astype(np.float32),
                    labels=all_labels.astype(np.int64)))
        return out


def _method(images, **kw):
    rescorer = RecordingRescorer(images, **kw)
    return Method('fake', rescorer)


def _table(evaluator, images, **kw):
    method = _method(images)
    idx = np.arange(len(images))
    labels = method.cache.gt_label_lists()
    out = evaluate_site_halves([method],
                               evaluator,
                               flat_prior(K),
                               dict(site=idx),
                               dict(site=batch_prior(K, labels)),
                               resamples=200,
                               **kw)
    return method, out


def test_split_halves_are_fixed_by_parity():
    a, b = split_halves([7, 3, 9, 4, 5])
    assert a.tolist() == [7, 9, 5] and b.tolist() == [3, 4]
    again = split_halves([7, 3, 9, 4, 5])
    assert a.tolist() == again[0].tolist()
    with pytest.raises(ValueError, match='at least 2 images'):
        split_halves([1])


def test_a_half_prior_never_scores_its_own_half_and_comes_with_support(
        tmp_path):
    # the halves' statistics differ
    evaluator, images = planted_site(tmp_path, 16, 'crossed')
    method, out = _table(evaluator, images)
    labels = method.cache.gt_label_lists()
    halves = site_halves(labels, np.arange(16), K)
    own = [batch_prior(K, [labels[i] for i in h]) for h in halves.halves]
    assert not np.allclose(own[0], own[1])
    site_prior = batch_prior(K, labels)
    rescorer = method.rescorer
    scored_halves = 0
    for prior, idx in rescorer.predicted:
        for h, half in enumerate(halves.halves):
            if set(idx) <= set(half):
                scored_halves += 1
                # a half is scored under E_t or the other half's statistics
                assert not np.allclose(prior, own[h])
                assert np.allclose(prior, own[1 - h]) or np.allclose(
                    prior, flat_prior(K))
    assert scored_halves >= 2
    # the whole site is scored only under E_t or its in-sample prior
    for prior, idx in rescorer.predicted:
        if len(idx) == 16:
            assert np.allclose(prior, flat_prior(K)) or np.allclose(
                prior, site_prior)
    # each half prior was given its half's support before it was scored
    for h, half in enumerate(halves.halves):
        got = [(n, p) for prior, n, p in rescorer.registered
               if np.allclose(prior, own[h])]
        assert got, f'half {h} prior registered without support'
        n, share = got[0]
        np.testing.assert_array_equal(n, np.full(K, len(half)))
        np.testing.assert_allclose(
            share,
            np.mean([[c in labels[i] for c in range(K)] for i in half],
                    axis=0))


def test_row_names_and_the_halves_each_scored_as_its_own_ap(tmp_path):
    evaluator, images = planted_site(tmp_path, 16, 'shared')
    method, out = _table(evaluator, images)
    rows = out['rows']
    assert [r['prior'] for r in rows] == ['E_t', IN_SAMPLE, SPLIT_HALF]
    assert IN_SAMPLE == 'E_site(in-sample)' and SPLIT_HALF == 'E_site'
    split = rows[2]
    ids = method.cache.img_ids()
    labels = method.cache.gt_label_lists()
    halves = site_halves(labels, np.arange(16), K)
    gains = []
    for h in (0, 1):
        idx, prior = halves.scoring(h)
        hid = [ids[i] for i in idx]
        own = evaluator.evaluate(hid, method.rescorer.predict(prior, idx))
        base = evaluator.evaluate(hid,
                                  method.rescorer.predict(flat_prior(K), idx))
        gains.append(own['AP'] - base['AP'])
        assert split['halves'][h]['AP'] == pytest.approx(own['AP'])
    # the mean of the halves' gains, not one AP of their union
    assert split['gain_AP'] == pytest.approx(np.mean(gains))
    assert split['gain_AP'] > 0.05
    for r in rows[1:]:
        lo, hi = r['interval']
        assert lo <= r['gain_AP'] <= hi


def test_split_half_shows_the_leak_that_in_sample_hides(tmp_path):
    # the odd half's pairs are not the even half's: one half's statistics
    # mislead on the other's images; in-sample they look useful
    evaluator, images = planted_site(tmp_path, 16, 'crossed')
    _, out = _table(evaluator, images)
    by = {r['prior']: r for r in out['rows']}
    assert by[IN_SAMPLE]['gain_AP'] > 0.05
    assert by[SPLIT_HALF]['gain_AP'] < by[IN_SAMPLE]['gain_AP'] - 0.05


def test_interval_narrows_with_more_images(tmp_path):
    widths = []
    for num in (16, 128):
        evaluator, images = planted_site(tmp_path, num, 'shared', f'site{num}')
        _, out = _table(evaluator, images)
        lo, hi = out['rows'][2]['interval']
        widths.append(hi - lo)
    assert widths[1] < widths[0]


def test_stratified_bootstrap_resamples_within_each_stratum(tmp_path):
    evaluator, images = planted_site(tmp_path, 16, 'shared')
    rescorer = RecordingRescorer(images)
    idx = np.arange(16)
    own, strata, _ = scored_matches(
        rescorer, evaluator,
        [(idx[:8], batch_prior(K, [images[i][2] for i in range(8, 16)])),
         (idx[8:], flat_prior(K))])
    base, _, _ = scored_matches(rescorer, evaluator,
                                [(idx[:8], flat_prior(K)),
                                 (idx[8:], flat_prior(K))])
    res = paired_bootstrap(
        own, base, 100, level=0.9, strata=strata, keep_diffs=True)
    # stratum 1 is scored alike: the mean halves stratum 0's gain
    half = 100 * (own.ap(strata[0]) - base.ap(strata[0]))
    assert res['diff'] == pytest.approx(half / 2)
    assert len(res['diffs']) == 100
    assert res['low'] <= res['diff'] <= res['high']
    with pytest.raises(ValueError, match='disjoint'):
        paired_bootstrap(own, base, 10, strata=[[0, 1], [1, 2]])
    # without strata: the bootstrap of before (same stream, same figures)
    plain = paired_bootstrap(own, base, 50, seed=3)
    again = paired_bootstrap(own, base, 50, seed=3, keep_diffs=True)
    assert (plain['low'], plain['high']) == (again['low'], again['high'])


def test_relation_classes_keep_the_marginals_within_a_quarter():
    train = np.array([0.4, 0.4, 0.2, 0.0])
    assert relation_classes(np.array([0.45, 0.2, 0.25, 0.1]), train) == \
        [0, 2]
    with pytest.raises(ValueError, match='training shares'):
        relation_classes(np.zeros(3), train)


def test_relation_only_gain_and_the_mean_over_sites(tmp_path):
    evaluator, images = planted_site(tmp_path, 16, 'shared')
    method = _method(images)
    labels = method.cache.gt_label_lists()
    parts = dict(a=np.arange(8), b=np.arange(8, 16))
    priors = {
        s: batch_prior(K, [labels[i] for i in idx])
        for s, idx in parts.items()
    }
    out = evaluate_site_halves([method],
                               evaluator,
                               flat_prior(K),
                               parts,
                               priors,
                               train_shares=np.full(K, 0.5),
                               resamples=100)
    split = [r for r in out['rows'] if r['prior'] == SPLIT_HALF]
    for r in split:
        assert r['relation_classes'] == ['c0', 'c1', 'c2', 'c3']
        # all classes kept: the relation-only gain is the AP gain
        assert r['relation_gain_AP'] == pytest.approx(r['gain_AP'])
    mean = {m['prior']: m for m in out['means']}[SPLIT_HALF]
    assert mean['sites'] == ['a', 'b']
    assert mean['gain_AP'] == pytest.approx(
        np.mean([r['gain_AP'] for r in split]))
    assert mean['interval'][0] <= mean['gain_AP'] <= mean['interval'][1]
    with pytest.raises(ValueError, match="no prior for site 'b'"):
        evaluate_site_halves([method], evaluator, flat_prior(K), parts,
                             dict(a=priors['a']))
    rows = [dict(r) for r in out['rows']]
    with pytest.raises(KeyError):
        mean_over_sites(rows, {})


def test_split_half_sweep(tmp_path):
    evaluator, images = planted_site(tmp_path, 16, 'shared')
    rescorer = RecordingRescorer(images)
    labels = rescorer.cache.gt_label_lists()
    halves = site_halves(labels, np.arange(16), K)
    e_t = flat_prior(K)
    rescorer.register_support(e_t, np.full(K, 100), np.full(K, 0.5))
    rows = split_half_sweep(
        rescorer, evaluator, e_t, halves, (0.0, 1.0), resamples=100)
    assert [(r['alpha'], r['prior']) for r in rows] == [(0.0, SPLIT_HALF),
                                                        (1.0, SPLIT_HALF)]
    assert rows[0]['gain'] == 0.0 and rows[1]['gain'] > 5
    lo, hi = rows[1]['interval']
    assert lo <= rows[1]['gain'] <= hi
    # the alpha-1 prior of a half is the other half's, with its support
    for h in (0, 1):
        n, _ = rescorer.support_of(halves.priors[1 - h])
        assert (n == len(halves.halves[1 - h])).all()
