# Copyright (c) mmcalidet contributors. All rights reserved.
"""fit_site_prior and the paired bootstrap over images, on the real
coco-mini val annotations with detections whose scores are a known
function of the prior (no detector: nothing depends on random weights)."""
import json
import os.path as osp

import numpy as np
import pytest
from mmdet.datasets import CocoDataset
from mmengine.structures import InstanceData

from mmcalidet.calibration import fit_site_prior
from mmcalidet.evaluation import CocoEvaluator, paired_bootstrap
from mmcalidet.priors import batch_prior, flat_prior, shrink, site_estimate
from testing import data_root
from testing.fake_cache import FakeCache

CLASSES = list(CocoDataset.METAINFO['classes'])
K = len(CLASSES)
ANN = osp.join(data_root(), 'coco-mini', 'reference',
               'instances_val2017_coco-mini.json')
PERSON = 0


@pytest.fixture(scope='module')
def evaluator():
    return CocoEvaluator(ANN, CLASSES)


@pytest.fixture(scope='module')
def site(evaluator):
    """24 annotated coco-mini val images: their ids and ground truth."""
    cat_to_label = {c: k for k, c in enumerate(evaluator.cat_ids)}
    images = []
    for img_id in evaluator.all_img_ids:
        anns = evaluator.coco.imgToAnns.get(img_id, [])
        if not anns:
            continue
        boxes = np.array([[
            a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
            a['bbox'][1] + a['bbox'][3]
        ] for a in anns])
        labels = np.array([cat_to_label[a['category_id']] for a in anns])
        images.append((img_id, boxes, labels))
        if len(images) == 24:
            break
    return images


@pytest.fixture(scope='module')
def paired_site(tmp_path_factory):
    """A site of 32 images whose classes come in pairs (0 with 1, 2 with
    3), as a COCO file: its evaluator and images."""
    classes = CLASSES[:4]
    images, anns, site = [], [], []
    for i in range(32):
        pair = (0, 1) if i % 2 == 0 else (2, 3)
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
    path = tmp_path_factory.mktemp('site') / 'site.json'
    with open(path, 'w') as f:
        json.dump(
            dict(
                images=images,
                annotations=anns,
                categories=[
                    dict(id=k + 1, name=name) for k, name in enumerate(classes)
                ]), f)
    return CocoEvaluator(str(path), classes), site


class PriorScoredRescorer:
    """A co-occurrence scorer: each ground-truth box detected with its
    class, and beside it a false positive box of a class the image does
    not show (the next site class), each scored by the mean of
    P(class | j) over the image's other classes j under the prior. Under a
    flat E_t every score ties; the site's statistics rank the true classes
    above the false ones. ``ignore_prior``: every score is 0.5."""

    def __init__(self, images, ignore_prior=False):
        self.cache = FakeCache(images)
        self.ignore_prior = ignore_prior
        self.site_classes = sorted(
            set(np.concatenate([labels for _, _, labels in images]).tolist()))

    def score(self, prior, cls, present):
        others = [j for j in present if j != cls]
        if self.ignore_prior or not others:
            return 0.5
        return float(np.mean(prior[cls, others]))

    def predict(self, prior, indices=None):
        prior = np.asarray(prior)
        indices = range(len(self.cache)) if indices is None else indices
        out = []
        for i in indices:
            _, boxes, labels = self.cache.images[i]
            present = sorted(set(labels.tolist()))
            absent = [c for c in self.site_classes if c not in present]
            false_cls = [absent[k % len(absent)] for k in labels]
            all_boxes = np.concatenate([boxes, boxes + 3.0])
            all_labels = np.concatenate([labels, false_cls])
            scores = [self.score(prior, c, present) for c in all_labels]
            out.append(
                InstanceData(
                    bboxes=all_boxes.astype(np.float32),
                    scores=np.asarray(scores, dtype=np.float32),
                    labels=all_labels.astype(np.int64)))
        return out


def jittered_detections(site, seed, sigma, false_per_image):
    """Each ground-truth box jittered by ``sigma`` pixels, plus up to
    ``false_per_image`` shifted boxes of the next class; random scores."""
    rng = np.random.default_rng(seed)
    results = []
    for _, boxes, labels in site:
        jitter = boxes + rng.normal(0, sigma, size=boxes.shape)
        false = slice(0, false_per_image)
        results.append(
            InstanceData(
                bboxes=np.concatenate([jitter, boxes[false] + 35]),
                scores=rng.uniform(size=len(boxes) + len(boxes[false])),
                labels=np.concatenate([labels, (labels[false] + 1) % K])))
    return results


def test_image_matches_give_cocoeval_ap(evaluator, site):
    results = jittered_detections(site, seed=0, sigma=4, false_per_image=1)
    ids = [img_id for img_id, _, _ in site]
    matches = evaluator.image_matches(ids, results)
    assert matches.ap() == pytest.approx(
        evaluator.evaluate(ids, results)['AP'], abs=1e-12)
    # a subset, as COCOeval scores it on its own
    assert matches.ap(range(10)) == pytest.approx(
        evaluator.evaluate(ids[:10], results[:10])['AP'], abs=1e-12)
    same = paired_bootstrap(matches, matches, resamples=50)
    assert same['diff'] == same['low'] == same['high'] == 0.0


def test_image_matches_of_a_multiset_equal_cocoeval_on_copies(
        evaluator, site, tmp_path):
    """A bootstrap draw (images repeated, some left out) scores as
    COCOeval scores a data set holding that many copies of each image."""
    results = jittered_detections(site, seed=1, sigma=6, false_per_image=2)
    rng = np.random.default_rng(1)
    ids = [img_id for img_id, _, _ in site]
    matches = evaluator.image_matches(ids, results)
    draws = [rng.integers(0, len(ids), size=size) for size in (24, 24, 9)]
    for draw in draws + [[3, 3, 3, 0, 7, 7], [5]]:
        images, anns, copies = [], [], []
        for copy_id, pos in enumerate(draw, start=1):
            img = dict(evaluator.coco.imgs[ids[pos]], id=copy_id)
            images.append(img)
            for ann in evaluator.coco.imgToAnns[ids[pos]]:
                anns.append(dict(ann, id=len(anns) + 1, image_id=copy_id))
            copies.append(results[pos])
        path = tmp_path / 'copies.json'
        with open(path, 'w') as f:
            json.dump(
                dict(
                    images=images,
                    annotations=anns,
                    categories=evaluator.coco.dataset['categories']), f)
        on_copies = CocoEvaluator(str(path), CLASSES).evaluate(
            list(range(1,
                       len(draw) + 1)), copies)['AP']
        assert matches.ap(draw) == pytest.approx(on_copies, abs=1e-12)
    with pytest.raises(IndexError, match='below 24'):
        matches.ap([0, 24])


def test_a_site_whose_statistics_help_gets_them(paired_site):
    evaluator, site = paired_site
    rescorer = PriorScoredRescorer(site)
    train_prior = flat_prior(4)
    fit = fit_site_prior(
        rescorer, evaluator, train_prior, folds=4, resamples=200, seed=0)
    assert fit.alpha > 0 and fit.gain > 10
    # the interval (percentiles of the paired resamples) is above 0
    assert 0 < fit.low <= fit.high
    estimate = site_estimate(rescorer.cache.gt_label_lists(), train_prior,
                             fit.absent)
    np.testing.assert_allclose(fit.estimate, estimate)
    np.testing.assert_allclose(fit.prior,
                               shrink(train_prior, estimate, fit.alpha))
    assert estimate[1, 0] == 1.0 and estimate[2, 1] == 0.0
    assert len(fit.table) == 10 and fit.num_images == 32
    assert fit.meta()['alpha'] == fit.alpha


def test_a_site_where_no_candidate_gains_keeps_e_t(evaluator, site):
    rescorer = PriorScoredRescorer(site, ignore_prior=True)
    train_prior = batch_prior(K, rescorer.cache.gt_label_lists())
    fit = fit_site_prior(rescorer, evaluator, train_prior, resamples=10)
    assert fit.alpha == 0.0 and fit.gain == 0.0
    np.testing.assert_array_equal(fit.prior, train_prior)
    assert all(row['gain'] == 0.0 for row in fit.table)


def test_estimates_and_bad_input():
    train_prior = flat_prior(4) * 0 + 0.3
    np.fill_diagonal(train_prior, 1.0)
    labels = [[0, 1], [1]]
    kept = site_estimate(labels, train_prior, 'train')
    flat = site_estimate(labels, train_prior, 'flat')
    # classes 2 and 3 never shown: E_t's columns, or flat 0.5
    np.testing.assert_array_equal(kept[:, 2:], train_prior[:, 2:])
    assert (flat[:3, 3] == 0.5).all() and flat[3, 3] == 1.0
    assert kept[0, 1] == 0.5 and kept[1, 0] == 1.0  # P(0|1), P(1|0)
    over = shrink(train_prior, kept, 2.0)
    assert over.min() >= 0 and over.max() <= 1
    with pytest.raises(ValueError, match='absent'):
        site_estimate(labels, train_prior, 'zero')
    with pytest.raises(ValueError, match='at least 2'):
        fit_site_prior(
            PriorScoredRescorer([(1, np.zeros((1, 4)), np.zeros(1, int))], 3),
            None, train_prior)


def test_deployment_gains_estimate_on_some_images_and_score_the_rest(
        paired_site):
    from mmcalidet.calibration import deployment_gains
    from mmcalidet.evaluation import mean_interval
    evaluator, site = paired_site
    rescorer = PriorScoredRescorer(site)
    res = deployment_gains(
        rescorer,
        evaluator,
        flat_prior(4),
        indices=range(32),
        num_labelled=16,
        repeats=3,
        seed=0)
    assert res['repeats'] == 3 and len(res['alphas']) == 3
    for name in ('raw', 'fitted'):
        assert len(res[name]['gains']) == 3
        assert res[name]['low'] <= res[name]['mean'] <= res[name]['high']
    # the site's pairs, learned from 16 images, hold on the other 16
    assert res['fitted']['low'] > 10 and res['raw']['low'] > 10
    assert all(alpha > 0 for alpha in res['alphas'])
    # no prior effect: the fitted prior stays E_t, gains are 0
    null = deployment_gains(
        PriorScoredRescorer(site, ignore_prior=True),
        evaluator,
        flat_prior(4),
        indices=range(32),
        num_labelled=16,
        repeats=2)
    assert null['fitted']['gains'] == [0.0, 0.0
                                       ] and null['alphas'] == [0.0, 0.0]
    assert mean_interval([1.5, 1.5, 1.5]) == dict(mean=1.5, low=1.5, high=1.5)
    with pytest.raises(ValueError, match='leave none'):
        deployment_gains(rescorer, evaluator, flat_prior(4), range(8), 8)


def test_the_shrinkage_sweep_follows_the_direction_of_the_shift(paired_site):
    from mmcalidet.evaluation import SWEEP_ALPHAS, shrinkage_sweep
    evaluator, site = paired_site
    rescorer = PriorScoredRescorer(site)
    train_prior = flat_prior(4)
    own = batch_prior(4, rescorer.cache.gt_label_lists())
    rows = shrinkage_sweep(rescorer, evaluator, train_prior, own, range(32))
    assert [r['alpha'] for r in rows] == list(SWEEP_ALPHAS)
    ids = [img_id for img_id, _, _ in site]
    for row in rows:
        # each point is COCO AP under E_t + alpha (E_site - E_t)
        prior = shrink(train_prior, own, row['alpha'])
        assert row['AP'] == pytest.approx(
            100 * evaluator.evaluate(ids, rescorer.predict(prior))['AP'])
        # the pairs help along the shift and hurt against it
        if row['alpha'] > 0:
            assert row['gain'] > 10
        elif row['alpha'] < 0:
            assert row['gain'] < 0
        else:
            assert row['gain'] == 0.0
    # a detector that ignores the prior: a flat sweep
    flat = shrinkage_sweep(
        PriorScoredRescorer(site, ignore_prior=True), evaluator, train_prior,
        own, range(32))
    assert all(r['gain'] == 0.0 for r in flat)


def test_accept_interval_leaves_e_t_only_beyond_resampling_noise(
        paired_site, monkeypatch):
    from mmcalidet.calibration import site_prior
    evaluator, site = paired_site
    rescorer = PriorScoredRescorer(site)
    train_prior = flat_prior(4)
    # a clear gain: its interval is above 0 and both rules take it
    by_gain = fit_site_prior(
        rescorer, evaluator, train_prior, resamples=200, accept='gain')
    by_interval = fit_site_prior(
        rescorer, evaluator, train_prior, resamples=200, accept='interval')
    assert by_interval.low > 0
    assert by_interval.alpha == by_gain.alpha > 0
    np.testing.assert_array_equal(by_interval.prior, by_gain.prior)

    # the same gain with an interval reaching below 0: only 'gain' moves
    def wide(first, second, resamples, seed):
        return dict(low=-1.0, high=30.0)

    monkeypatch.setattr(site_prior, 'paired_bootstrap', wide)
    assert fit_site_prior(
        rescorer, evaluator, train_prior, resamples=200,
        accept='gain').alpha == by_gain.alpha
    held = fit_site_prior(
        rescorer, evaluator, train_prior, resamples=200, accept='interval')
    assert held.alpha == 0.0 and held.gain == 0.0
    np.testing.assert_array_equal(held.prior, train_prior)
    with pytest.raises(ValueError, match='accept'):
        fit_site_prior(rescorer, evaluator, train_prior, accept='always')
    with pytest.raises(ValueError, match='resamples'):
        fit_site_prior(
            rescorer, evaluator, train_prior, resamples=0, accept='interval')
