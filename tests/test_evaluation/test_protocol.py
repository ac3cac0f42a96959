# Copyright (c) mmcalidet contributors. All rights reserved.
"""``mmcalidet.evaluation.protocol``: each table's rows and Markdown on a
cached tiny CaliDINO with known scores (classes 1 and 2 on every image,
see ``set_known_scores``). The checks are contracts (rows, columns,
verdicts from a scripted evaluation, numbers the library's own functions
give), not accuracy."""
import numpy as np
import pytest

from mmcalidet.evaluation import (METRICS, SWEEP_ALPHAS, Rescorer,
                                  cache_evaluator)
from mmcalidet.evaluation import protocol as P
from mmcalidet.evaluation import report, site_priors
from mmcalidet.evaluation.sweep import Method
from mmcalidet.priors import batch_prior, prior_mae
from testing import known_scores_setup

K = 80
#: the site of each of the 4 cached images
GROUPS = ['b', 'a', 'b', 'a']


@pytest.fixture(scope='module')
def setup():
    model, _, cache, evaluator = known_scores_setup((1, 2))
    return model, cache, evaluator, Method('CaliDINO', Rescorer(model, cache))


def _sites(cache):
    priors = site_priors(cache.gt_label_lists(), GROUPS, K, ['a', 'b'])
    parts = dict(a=np.array([1, 3]), b=np.array([0, 2]))
    return priors, parts


def _body(markdown: str) -> list:
    """The table's lines after the header and the rule."""
    lines = markdown.splitlines()
    assert lines[1].startswith('|---')
    return lines[2:]


def scripted(values):
    """An ``evaluate`` whose AP is the next of ``values`` per call."""
    it = iter(values)

    def evaluate(cache, preds, indices=None):
        ap = next(it)
        return {m: ap for m in METRICS}

    return evaluate


def test_injection_builds_evaluates_and_orders(setup):
    model, _, _, method = setup
    names = ('flip_E_x', 'E0', 'E_t', 'E_x')
    table = P.injection([method],
                        scripted([0.1, 0.2, 0.3, 0.4]),
                        model.get_prior(),
                        names,
                        orders=dict(orders=names, short=('E0', 'E_x')),
                        progress=False)
    assert [r['key'] for r in table.rows] == list(names)
    assert [r['AP'] for r in table.rows] == [0.1, 0.2, 0.3, 0.4]
    assert [s.key for s in table.extras['specs']] == list(names)
    assert table.extras['orders']['CaliDINO']['verdict'] == 'holds'
    assert table.extras['short']['CaliDINO']['order'] == ['E0', 'E_x']
    body = _body(table.markdown)
    assert len(body) == 4 and body[2].startswith('| CaliDINO | E_t |')
    # a drop along the order: the verdict says so, and names the step
    worse = P.injection([method],
                        scripted([0.1, 0.3, 0.2, 0.4]),
                        model.get_prior(),
                        names,
                        orders=dict(orders=names),
                        progress=False)
    order = worse.extras['orders']['CaliDINO']
    assert order['verdict'] == 'does not hold'
    line, = report.order_lines(worse.extras['orders'])
    assert line.startswith('- CaliDINO: flip_E_x <= E0 <= E_t <= E_x: '
                           '**does not hold: E0 > E_t')


def test_sites_table(setup):
    model, cache, evaluator, method = setup
    priors, parts = _sites(cache)
    e_t = model.get_prior()
    table = P.sites([method], evaluator, e_t, parts, priors, resamples=20)
    assert [(r['site'], r['prior'])
            for r in table.rows] == [('a', 'E_t'), ('a', 'E_site(in-sample)'),
                                     ('a', 'E_site'), ('b', 'E_t'),
                                     ('b', 'E_site(in-sample)'),
                                     ('b', 'E_site')]
    assert table.rows[0]['epsilon'] == pytest.approx(
        prior_mae(priors['a'], e_t))
    evaluate = cache_evaluator(evaluator)
    for r in table.rows:
        idx = parts[r['site']]
        if r['prior'] == 'E_site(in-sample)':
            # the site's own statistics on the images they came from
            own = evaluate(cache,
                           method.rescorer.predict(priors[r['site']], idx),
                           idx)
            assert r['AP'] == own['AP']
        if r['prior'] == 'E_site':
            # each of the site's two images under the other's statistics
            assert [h['num_images'] for h in r['halves']] == [1, 1]
            labels = cache.gt_label_lists()
            other = batch_prior(K, [labels[idx[1]]])
            one = evaluate(cache, method.rescorer.predict(other, idx[:1]),
                           idx[:1])
            assert r['halves'][0]['AP'] == pytest.approx(
                one['AP'], nan_ok=True)
        if r['prior'] != 'E_t':
            assert len(r['interval']) == 2
    header = table.markdown.splitlines()[0]
    assert header.startswith('| site | images | epsilon | method | prior |')
    assert header.endswith('| AP gain | 90 % interval |')
    assert len(_body(table.markdown)) == 6
    means = table.extras['means']
    assert [(m['method'], m['prior'])
            for m in means] == [('CaliDINO', 'E_site(in-sample)'),
                                ('CaliDINO', 'E_site')]
    assert 'mean AP gain' in table.extras['summary_md']


def test_deployment_table(setup):
    model, cache, evaluator, method = setup
    e_t = model.get_prior()
    parts = dict(all=np.arange(len(cache)), tiny=np.array([0, 1]))
    table = P.deployment([method],
                         evaluator,
                         e_t,
                         parts,
                         labelled=[2, 8],
                         repeats=2,
                         progress=False)
    # 'all': 2 and min(8, 3) labelled images; 'tiny' keeps one image to
    # evaluate on, too few to fit from: no row
    assert [(r['site'], r['prior'])
            for r in table.rows] == [('all', 'E_site(2) raw'),
                                     ('all', 'E_site(2) fitted'),
                                     ('all', 'E_site(3) raw'),
                                     ('all', 'E_site(3) fitted')]
    for r in table.rows:
        assert r['low'] <= r['gain'] <= r['high'] and len(r['gains']) == 2
        assert (r['alpha'] is None) == r['prior'].endswith('raw')
    assert len(_body(table.markdown)) == 4
    none = P.deployment([method], evaluator, e_t, parts, repeats=0)
    assert none.rows == [] and none.markdown == ''


def test_sweep_table(setup):
    model, cache, evaluator, method = setup
    priors, parts = _sites(cache)
    table = P.sweep([method],
                    evaluator,
                    model.get_prior(),
                    parts,
                    priors,
                    resamples=20)
    # per site, the in-sample sweep and the split-half one
    assert len(table.rows) == 2 * 2 * len(SWEEP_ALPHAS)
    assert {r['prior'] for r in table.rows} == {'E_site(in-sample)', 'E_site'}
    pivot = report.sweep_table(table.rows)
    assert [(r['site'], r['method'], r['prior'])
            for r in pivot] == [('a', 'CaliDINO', 'E_site(in-sample)'),
                                ('a', 'CaliDINO', 'E_site'),
                                ('b', 'CaliDINO', 'E_site(in-sample)'),
                                ('b', 'CaliDINO', 'E_site')]
    at_0 = [r['AP'] for r in table.rows if r['alpha'] == 0]
    assert [r['AP_E_t'] for r in pivot] == at_0
    for r in pivot:
        assert r['alpha 0'] == 0
    for r in table.rows:
        lo, hi = r['interval']
        assert lo <= hi or lo != lo  # nan: no ground truth to resample
    header = table.markdown.splitlines()[0]
    assert 'alpha 1 |' in header and header.endswith('| peak at alpha |')
    assert len(_body(table.markdown)) == 4


def test_subsets_table(setup):
    model, cache, evaluator, method = setup
    table = P.subsets([method],
                      cache_evaluator(evaluator),
                      model.get_prior(), (2, 8),
                      seed=1,
                      progress=False)
    # size 8 exceeds the 4 images: left out
    assert [(r['size'], r['prior']) for r in table.rows] == [(2, 'E_t'),
                                                             (2, 'E_b')]
    assert len(_body(table.markdown)) == 2
    empty = P.subsets([method],
                      cache_evaluator(evaluator),
                      model.get_prior(), (8, ),
                      progress=False)
    assert empty.rows == [] and empty.markdown == ''


def test_self_calibration_table(setup):
    model, cache, evaluator, method = setup
    priors, parts = _sites(cache)
    e_t = model.get_prior()
    evaluate = cache_evaluator(evaluator)
    table = P.self_calibration([method],
                               evaluate,
                               e_t,
                               parts,
                               priors,
                               iters=2,
                               score_thr=0.5,
                               radii=[0.05, None])
    assert [(r['site'], r['radius']) for r in table.rows] == [('a', 0.05),
                                                              ('a', None),
                                                              ('b', 0.05),
                                                              ('b', None)]
    assert list(table.extras['curves']) == [
        'CaliDINO, a, radius 0.05', 'CaliDINO, a', 'CaliDINO, b, radius 0.05',
        'CaliDINO, b'
    ]
    for r in table.rows:
        idx = parts[r['site']]
        start = evaluate(cache, method.rescorer.predict(e_t, idx), idx)
        assert r['AP_start'] == start['AP']
        assert r['gain'] == r['AP_end'] - r['AP_start']
        assert r['epsilon'] == pytest.approx(prior_mae(priors[r['site']], e_t))
    run = table.extras['runs'][('CaliDINO', None)]['results'][0]
    assert table.rows[1]['epsilon_end'] == pytest.approx(
        prior_mae(priors['a'], run.prior))
    assert len(_body(table.markdown)) == 4
    # without the partitions' own priors: no epsilon
    bare = P.self_calibration([method],
                              evaluate,
                              e_t,
                              dict(a=parts['a']),
                              iters=1)
    assert bare.rows[0]['epsilon'] is None
    assert '| a | CaliDINO | 0.30 | 0.05 | - |' in bare.markdown


def test_online_table(setup):
    model, cache, evaluator, method = setup
    priors, parts = _sites(cache)
    e_t = model.get_prior()
    evaluate = cache_evaluator(evaluator)
    table = P.online([method],
                     evaluate,
                     e_t,
                     parts,
                     priors,
                     radii=[None, 0.05],
                     batch_size=1)
    assert [(r['radius'], r['site']) for r in table.rows] == [(None, 'a'),
                                                              (None, 'b'),
                                                              (0.05, 'a'),
                                                              (0.05, 'b')]
    for r in table.rows:
        idx = parts[r['site']]
        start = evaluate(cache, method.rescorer.predict(e_t, idx), idx)
        assert r['AP_start'] == start['AP']
        assert r['gain'] == r['AP_stream'] - r['AP_start']
        assert r['updates'] >= 0
    assert len(_body(table.markdown)) == 4
    assert table.markdown.splitlines()[0] == (
        '| site | method | trust radius | updates | AP(E_t) | AP streamed | '
        'gain | epsilon(E_site, E_c) |')


def test_tables_leave_out_methods_without_a_prior(setup):
    model, cache, evaluator, method = setup

    class Plain:
        name, takes_prior, cache = 'plain', False, method.cache

    priors, parts = _sites(cache)
    e_t = model.get_prior()
    table = P.sweep([Plain(), method], evaluator, e_t, parts, priors)
    assert {r['method'] for r in table.rows} == {'CaliDINO'}
    table = P.online([Plain(), method], cache_evaluator(evaluator), e_t,
                     dict(a=parts['a']))
    assert [r['method'] for r in table.rows] == ['CaliDINO']
