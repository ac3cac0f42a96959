# Copyright (c) mmcalidet contributors. All rights reserved.
"""The benchmark's split-half measurements: the headroom figures score a
half only under what was fitted on the other half, and the calibrator
seeds' summary gives each row's mean and range."""
import json

import numpy as np
import pytest
from mmengine.structures import InstanceData

from mmcalidet.evaluation import CocoEvaluator, site_halves
from projects.context_shift.context_shift.headroom import _fitted_gain
from projects.context_shift.context_shift.seeds import seed_markdown, seed_rows


class _Cache:

    def __init__(self, num):
        self.num = num

    def img_ids(self):
        return list(range(1, self.num + 1))


def _evaluator(tmp_path, num):
    """``num`` images, one box of class 0 each."""
    images = [
        dict(id=i, width=100, height=100, file_name=f'{i}.jpg')
        for i in range(1, num + 1)
    ]
    anns = [
        dict(
            id=i,
            image_id=i,
            category_id=1,
            bbox=[10, 10, 40, 40],
            area=1600.0,
            iscrowd=0) for i in range(1, num + 1)
    ]
    path = tmp_path / 'ann.json'
    path.write_text(
        json.dumps(
            dict(
                images=images,
                annotations=anns,
                categories=[dict(id=1, name='a')])))
    return CocoEvaluator(str(path), ['a'])


def test_headroom_scores_a_half_only_under_the_other_halfs_fit(tmp_path):
    num = 8
    evaluator = _evaluator(tmp_path, num)
    labels = [np.array([0])] * num
    halves = site_halves(labels, np.arange(num), 1)
    calls = []

    def scored(fit, half):
        calls.append((fit, half))
        out = []
        for i in halves.halves[half]:
            # a fit helps: the true box above a false one; E_t: below
            good = fit is not None
            out.append(
                InstanceData(
                    bboxes=np.array([[10, 10, 50, 50], [60, 60, 90, 90]],
                                    np.float32),
                    scores=np.array([0.9, 0.5] if good else [0.4, 0.6] if i %
                                    2 else [0.9, 0.5], np.float32),
                    labels=np.zeros(2, np.int64)))
        return out

    res = _fitted_gain(evaluator, _Cache(num), halves, scored,
                       dict(resamples=50, seed=0, level=0.9))
    # fitted on one half, scored on the other (or E_t on its own half)
    assert sorted(
        calls, key=str) == sorted([(1, 0), (0, 1), (None, 0), (None, 1)],
                                  key=str)
    assert all(fit != half for fit, half in calls)
    assert res['gain'] > 0
    lo, hi = res['interval']
    assert lo <= res['gain'] <= hi


def test_seed_rows_give_each_rows_mean_and_range():

    def result(gain):
        return dict(
            sites=[
                dict(
                    site='s', method='CaliDINO', prior='E_site', gain_AP=gain),
                dict(site='s', method='CaliDINO', prior='E_t', AP=0.5)
            ],
            site_means=[dict(method='CaliDINO', prior='E_site', gain_AP=gain)],
            sweep=[
                dict(
                    site='s',
                    method='CaliDINO',
                    prior='E_site',
                    alpha=1.0,
                    gain=100 * gain)
            ])

    rows = seed_rows({0: result(0.01), 1: result(-0.02), 2: result(0.04)})
    site = next(r for r in rows if r['table'] == 'sites')
    assert site['gains'] == pytest.approx([1.0, -2.0, 4.0])
    assert site['mean'] == pytest.approx(1.0)
    assert (site['low'], site['high']) == pytest.approx((-2.0, 4.0))
    # the E_t row has no gain: no seed row
    assert len([r for r in rows if r['table'] == 'sites']) == 1
    sweep = next(r for r in rows if r['table'] == 'sweep')
    assert sweep['mean'] == pytest.approx(1.0) and sweep['alpha'] == 1.0
    md = seed_markdown(rows, [0, 1, 2])
    assert '[-2.00, +4.00]' in md and 'mean over sites' in md
    with pytest.raises(ValueError, match='missing under some'):
        seed_rows({
            0: result(0.01),
            1: dict(sites=[], site_means=[], sweep=[])
        })
    with pytest.raises(ValueError, match='no calibrator seed'):
        seed_rows({})
