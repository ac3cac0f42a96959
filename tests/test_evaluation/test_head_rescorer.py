# Copyright (c) mmcalidet contributors. All rights reserved.
"""HeadRescorer on a FeatureCache: a one- or two-stage CaliDet detector
scored under any prior from its cached features gives what
``model.predict`` gives under the same prior (E0, shared, per image),
remembers what it scored, and serves the site-prior fit and the
self-calibration; a plain one-stage detector gives its ``model.predict``,
alone or under a post-hoc correction of its locations' logits, a plain
two-stage one alone or re-weighted on its RoI head's softmax; a
correction of a CaliDet detector is refused.

Four real coco-mini val images at most 256 px, random weights: only the
equality of two paths is asserted, never what the weights detect."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS
from mmengine.dataset import pseudo_collate

from mmcalidet.calibration import (SelfCalibrationResult, SitePriorFit,
                                   fit_site_prior, self_calibrate, stream_site)
from mmcalidet.evaluation import (CocoEvaluator, CooccurrenceRescoring,
                                  FeatureCache, HeadRescorer, Method,
                                  PriorReweighting, PriorSpec, Rescorer,
                                  cache_evaluator, evaluate_priors,
                                  rescorer_for)
from mmcalidet.evaluation.head_scoring import corrected_levels
from mmcalidet.priors import flat_prior
from testing import build_detector, data_root, get_config, random_prior

RTMDET = 'calidet/calidet_rtmdet_tiny_coco-mini.py'
FASTER_RCNN = 'calidet/calidet_faster-rcnn_tiny_coco-mini.py'
ANN = osp.join(data_root(), 'coco-mini', 'reference',
               'instances_val2017_coco-mini.json')
K = 80
NUM_IMAGES = 4


def coco_mini_batches(config, num=NUM_IMAGES, batch_size=1):
    """The first ``num`` val images of the config's test data loader in
    batches of ``batch_size``.

    One image a batch: no padded region, whose locations all score alike
    and, tied, come out in any order when a float's last bit changes.
    """
    dataset_cfg = copy.deepcopy(get_config(config).val_dataloader.dataset)
    dataset_cfg.indices = num
    dataset = DATASETS.build(dataset_cfg)
    items = [dataset[i] for i in range(num)]
    return [
        pseudo_collate(items[i:i + batch_size])
        for i in range(0, num, batch_size)
    ]


def answering(model, head, seed=1):
    """Give ``head`` a CaliFormer whose V' is not 0 and depends on the
    prior, deterministically."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.califormer.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model._cali_cache = None
    return gen


@pytest.fixture(scope='module')
def rtmdet():
    """A CaliRTMDet whose scores move with the prior: classification
    towers and CaliFormer not 0, rho 1 and no class bias (scores near 0.5,
    where a logit's change shows), every detection kept."""
    model = build_detector(RTMDET, seed=0)
    head = model.bbox_head
    gen = answering(model, head)
    with torch.no_grad():
        for p in head.cls_convs.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for conv in head.rtm_cls:
            conv.bias.zero_()
    head.rho = 1.0
    head.test_cfg.update(
        score_thr=0.0, nms_pre=200, max_per_img=50, min_bbox_size=-1)
    return model.eval()


@pytest.fixture(scope='module')
def faster_rcnn():
    """A CaliFasterRCNN with a CaliFormer not 0 (rho 5: softmax scores of
    81 classes move little), fewer proposals, every detection kept."""
    model = build_detector(FASTER_RCNN, seed=0)
    head = model.roi_head.bbox_head
    answering(model, head)
    head.rho = 5.0
    model.roi_head.test_cfg.score_thr = 0.0
    model.roi_head.test_cfg.max_per_img = 50
    model.rpn_head.test_cfg.update(nms_pre=200, max_per_img=50)
    return model.eval()


@pytest.fixture(scope='module')
def rtmdet_data(rtmdet):
    batches = coco_mini_batches(RTMDET)
    return batches, FeatureCache.from_batches(rtmdet, batches)


@pytest.fixture(scope='module')
def faster_rcnn_data(faster_rcnn):
    batches = coco_mini_batches(FASTER_RCNN, num=2)  # its RPN is slow
    return batches, FeatureCache.from_batches(faster_rcnn, batches)


def model_predictions(model, batches, priors=None):
    """``model.predict`` on the batches: the deployment prior, or each
    image's data-sample ``prior`` (a K x K or an (N, K, K) stack)."""
    out = []
    for b, batch in enumerate(batches):
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        samples = data['data_samples']
        if priors is not None:
            for i, sample in enumerate(samples):
                prior = priors if priors.ndim == 2 else \
                    priors[b * len(batches[0]['inputs']) + i]
                sample.prior = torch.as_tensor(prior, dtype=torch.float32)
        with torch.no_grad():
            out += [
                s.pred_instances
                for s in model.predict(data['inputs'], samples)
            ]
    return out


def canonical(result, groups):
    """Labels and boxes of a result ordered by tie group, then label and
    box: the order of tied detections is the sort's, and a last bit of
    V' (computed for a batch of priors or for one) may change it."""
    boxes = result.bboxes.numpy()
    order = np.lexsort((*boxes.T[::-1], result.labels.numpy(), groups))
    return result.labels[order], result.bboxes[order]


def assert_same(found, expected, tie=1e-6):
    """Equal detections, up to the order of those whose scores tie (the
    random weights score the locations of a padded region alike). The
    last tie group, which the top-k may cut anywhere, is left out."""
    assert len(found) == len(expected)
    for a, b in zip(found, expected):
        assert len(a) == len(b) > 0
        torch.testing.assert_close(a.scores, b.scores)
        gaps = np.abs(np.diff(b.scores.numpy())) > tie
        groups = np.concatenate([[0], np.cumsum(gaps)])
        keep = groups < groups[-1]
        assert keep.sum() >= len(b) // 2, 'too many ties to compare'
        for x, y in zip(canonical(a, groups), canonical(b, groups)):
            torch.testing.assert_close(x[torch.from_numpy(keep)],
                                       y[torch.from_numpy(keep)])


def image_priors():
    """Four different per-image priors."""
    return np.stack([random_prior(seed) for seed in (3, 5, 7, 9)])


@pytest.mark.parametrize('name', ['rtmdet', 'faster_rcnn'])
def test_equals_model_predict_under_e0_a_shared_and_per_image_priors(
        name, request):
    model = request.getfixturevalue(name)
    batches, cache = request.getfixturevalue(f'{name}_data')
    rescorer = HeadRescorer(model, cache, batch_size=3)
    assert rescorer.num_classes == K
    model.set_prior(None)
    plain = model_predictions(model, batches)
    assert_same(rescorer.predict(), plain)
    assert_same(rescorer.predict(flat_prior(K)), plain)
    site = random_prior(11)
    model.set_prior(site)
    deployed = model_predictions(model, batches)
    model.set_prior(None)
    assert_same(rescorer.predict(site), deployed)
    # the prior reaches the scores: the equalities above tell priors apart
    assert not torch.allclose(deployed[0].scores, plain[0].scores)
    stack = image_priors()[:len(cache)]
    per_image = model_predictions(model, batches, stack)
    assert_same(rescorer.predict(stack), per_image)


@pytest.mark.parametrize('name', ['rtmdet', 'faster_rcnn'])
def test_what_the_prior_does_not_reach_runs_once_per_image(name, request):
    """The dense head (one-stage), or the RPN and the box head's layers
    before ``fc_cls`` (two-stage), run on the first scoring of an image
    only; later priors reuse what they gave."""
    model = request.getfixturevalue(name)
    _, cache = request.getfixturevalue(f'{name}_data')
    parts = [model.bbox_head] if name == 'rtmdet' else [
        model.rpn_head, model.roi_head.bbox_roi_extractor,
        model.roi_head.bbox_head.shared_fcs[0]
    ]
    calls = {i: 0 for i in range(len(parts))}
    hooks = [
        part.register_forward_hook(
            lambda *args, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, part in enumerate(parts)
    ]
    try:
        rescorer = HeadRescorer(model, cache, batch_size=1)
        first = rescorer.predict(random_prior(3))
        assert set(calls.values()) == {len(cache)}
        rescorer.predict(random_prior(5))
        rescorer.predict(image_priors()[:len(cache)])
        again = rescorer.predict(random_prior(3))
    finally:
        for hook in hooks:
            hook.remove()
    assert set(calls.values()) == {len(cache)}
    assert_same(again, first)


def test_any_images_in_any_order_equal_model_predict(rtmdet, rtmdet_data):
    batches, cache = rtmdet_data
    rescorer = HeadRescorer(rtmdet, cache, batch_size=3)
    stack = image_priors()
    per_image = model_predictions(rtmdet, batches, stack)
    # a subset in another order: its stack, or the priors by image index
    order = [3, 0, 2]
    expected = [per_image[i] for i in order]
    assert_same(rescorer.predict(stack[order], order), expected)
    assert_same(rescorer.predict(lambda idx: stack[idx], order), expected)
    samples = rescorer.predict_samples(stack[order], order)
    assert [s.img_id for s in samples] == [cache.img_ids()[i] for i in order]
    assert_same([s.pred_instances for s in samples], expected)


def test_a_prior_that_moves_v_prime_moves_the_scores_and_is_remembered(
        rtmdet, rtmdet_data):
    _, cache = rtmdet_data
    rescorer = HeadRescorer(rtmdet, cache)
    head = rtmdet.bbox_head
    site = random_prior(11)
    with torch.no_grad():
        moved = head.get_cali_vectors(
            torch.as_tensor(site,
                            dtype=torch.float32)) - head.get_cali_vectors(
                                head.flat_priors(torch.zeros(1)))
    assert float(moved.abs().max()) > 1e-3
    flat, shifted = rescorer.predict(flat_prior(K)), rescorer.predict(site)
    assert not torch.allclose(flat[0].scores[:5], shifted[0].scores[:5])
    assert rescorer.calls == dict(scored=2, reused=0)
    rescorer.remember()
    first = rescorer.predict(site, [0, 1])
    again = rescorer.predict(site.astype(np.float32), [0, 1])
    assert all(a is b for a, b in zip(first, again))
    with rescorer.keeping_none():
        rescorer.predict(flat_prior(K), [0, 1])
        rescorer.predict(flat_prior(K), [0, 1])
    assert rescorer.calls == dict(scored=5, reused=1)
    rescorer.remember(False)


def test_site_fit_self_calibration_stream_and_sweep_run_on_it(
        rtmdet, rtmdet_data):
    _, cache = rtmdet_data
    rescorer = HeadRescorer(rtmdet, cache)
    evaluator = CocoEvaluator(ANN, CocoDataset.METAINFO['classes'])
    train_prior = random_prior(3)
    fit = fit_site_prior(
        rescorer,
        evaluator,
        train_prior,
        alphas=(0.5, 1.0),
        absent=('train', ),
        folds=2,
        resamples=10)
    assert isinstance(fit, SitePriorFit)
    assert fit.prior.shape == (K, K) and fit.num_images == NUM_IMAGES
    assert len(fit.table) == 2 and fit.folds == 2
    result = self_calibrate(
        rtmdet,
        cache,
        iters=2,
        init_prior=train_prior,
        evaluate=lambda preds: evaluator.evaluate(cache.img_ids(), preds))
    assert isinstance(result, SelfCalibrationResult)
    assert result.prior.shape == (K, K) and len(result.predictions) == 4
    assert 1 <= len(result.history) <= 3
    assert 'AP' in result.history[0]
    # images as paths: cached through the model's test pipeline
    paths = [s.img_path for s in cache.data_samples[:2]]
    from_paths = self_calibrate(rtmdet, paths, iters=1, init_prior=train_prior)
    assert len(from_paths.predictions) == 2
    streamed = stream_site(
        rescorer,
        cache_evaluator(evaluator),
        range(NUM_IMAGES),
        train_prior,
        trust_radius=None,
        batch_size=2)
    assert streamed['prior'].shape == (K, K) and 'gain' in streamed
    rows = evaluate_priors([Method('CaliRTMDet', rescorer)],
                           [PriorSpec('E_t', 'E_t', False, train_prior)],
                           cache_evaluator(evaluator),
                           progress=False)
    assert [(r['method'], r['prior']) for r in rows] == [('CaliRTMDet', 'E_t')]
    assert 'AP' in rows[0]


def test_other_models_corrections_and_bad_input_are_refused(
        rtmdet, rtmdet_data):
    _, cache = rtmdet_data
    with pytest.raises(TypeError, match='calibratable one- or two-stage'):
        HeadRescorer(torch.nn.Linear(2, 2), cache)
    with pytest.raises(ValueError, match='no post-hoc correction'):
        HeadRescorer(rtmdet, cache, correction=lambda logits, p: logits)
    with pytest.raises(TypeError, match='HeadRescorer'):
        Rescorer(rtmdet, cache)
    with pytest.raises(TypeError, match='FeatureCache'):
        HeadRescorer(rtmdet, [cache])
    rescorer = HeadRescorer(rtmdet, cache)
    with pytest.raises(ValueError, match='shape'):
        rescorer.predict(image_priors()[:2])
    with pytest.raises(IndexError, match='not among the 4'):
        rescorer.predict(None, [4])
    sizes = {cache.shape_of(i) for i in range(len(cache))}
    assert len(sizes) == 2  # three landscape images, one portrait
    with pytest.raises(ValueError, match='different feature sizes'):
        cache.get([0, 3])


@pytest.fixture(scope='module')
def plain_rtmdet():
    """The plain RTMDet-tiny (random weights), classification towers not
    0 and no class bias, every detection kept."""
    model = build_detector('calidet/rtmdet_tiny_coco-mini.py', seed=0)
    head = model.bbox_head
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in head.cls_convs.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for conv in head.rtm_cls:
            conv.bias.zero_()
    head.test_cfg.update(
        score_thr=0.0, nms_pre=200, max_per_img=50, min_bbox_size=-1)
    return model.eval()


def test_a_plain_one_stage_detector_and_its_corrections(plain_rtmdet):
    batches = coco_mini_batches(RTMDET)
    cache = FeatureCache.from_batches(plain_rtmdet, batches)
    rescorer = rescorer_for(plain_rtmdet, cache, batch_size=3)
    assert isinstance(rescorer, HeadRescorer)
    assert not rescorer.calibratable
    plain = model_predictions(plain_rtmdet, batches)
    assert_same(rescorer.predict(), plain)
    with pytest.raises(ValueError, match='takes no prior'):
        rescorer.predict(flat_prior(K))
    # the marginal re-weighting is the identity at its reference E_t, and
    # moves the scores under another prior (shared or per image)
    e_t = random_prior(13)
    freq = np.linspace(0.05, 0.5, K)
    reweight = HeadRescorer(plain_rtmdet, cache, PriorReweighting(e_t, freq))
    assert reweight.calibratable is False and reweight.correction is not None
    assert_same(reweight.predict(e_t), plain)
    with pytest.raises(ValueError, match='needs a prior'):
        reweight.predict()
    other = reweight.predict(random_prior(17))
    assert not torch.allclose(other[0].scores, plain[0].scores)
    stack = np.stack([random_prior(17)] * len(cache))
    assert_same(reweight.predict(stack), other)


@pytest.fixture(scope='module')
def plain_faster_rcnn():
    """The plain tiny Faster R-CNN (random weights), fewer proposals,
    every detection kept, on two coco-mini val images."""
    model = build_detector('calidet/faster-rcnn_tiny_coco-mini.py', seed=0)
    model.roi_head.test_cfg.score_thr = 0.0
    model.roi_head.test_cfg.max_per_img = 50
    model.rpn_head.test_cfg.update(nms_pre=200, max_per_img=50)
    model.eval()
    batches = coco_mini_batches('calidet/faster-rcnn_tiny_coco-mini.py',
                                num=2)
    return model, batches, FeatureCache.from_batches(model, batches)


@pytest.mark.slow  # a second Faster R-CNN: not for the unit tier
def test_a_plain_two_stage_detector_reweighted_is_a_fc_cls_bias_shift(
        plain_faster_rcnn):
    """The marginal re-weighting of a plain Faster R-CNN's softmax
    (mmcalidet/evaluation/roi_correction.py) is the identity at E_ref, the
    same per image as shared, and what ``model.predict`` gives with its
    shift added to fc_cls's foreground biases."""
    model, batches, cache = plain_faster_rcnn
    corr = PriorReweighting(random_prior(13), np.linspace(0.05, 0.5, K))
    rescorer = HeadRescorer(model, cache, corr)
    plain = model_predictions(model, batches)
    assert_same(rescorer.predict(corr.ref_prior), plain)  # 0 at E_ref
    with pytest.raises(ValueError, match='needs a prior'):
        rescorer.predict()
    prior = random_prior(17)
    shared = rescorer.predict(prior)
    assert not torch.allclose(shared[0].scores, plain[0].scores)
    assert_same(rescorer.predict(np.stack([prior] * len(cache))), shared)
    bias = model.roi_head.bbox_head.fc_cls.bias
    saved = bias.detach().clone()
    try:
        with torch.no_grad():
            bias[:K] += corr.softmax_shift(
                torch.as_tensor(prior, dtype=torch.float32))
        assert_same(shared, model_predictions(model, batches))
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    with pytest.raises(ValueError, match='CooccurrenceRescoring'):
        HeadRescorer(model, cache, CooccurrenceRescoring(random_prior(1)))


def test_a_correction_sees_every_location_of_an_image_at_once():
    levels = [torch.randn(2, 3, 4, 4), torch.randn(2, 3, 2, 2)]
    seen = []

    def add_class_index(logits, priors):
        seen.append(tuple(logits.shape))
        return logits + torch.arange(3.0)

    out = corrected_levels(levels, torch.eye(3), add_class_index)
    assert seen == [(2, 20, 3)]
    for before, after in zip(levels, out):
        assert after.shape == before.shape
        torch.testing.assert_close(
            after - before,
            torch.arange(3.0).view(1, 3, 1, 1).expand_as(before))


def test_eval_setup_evaluates_a_one_stage_pair_on_one_feature_cache(tmp_path):
    """EvalSetup of a CaliRTMDet that keeps a plain RTMDet's weights:
    one FeatureCache serves both, and the plain RTMDet's rows (alone and
    re-weighted) are HeadRescorers on it; at E_t the re-weighting gives
    the plain RTMDet's detections."""
    from mmengine.runner import save_checkpoint

    from mmcalidet.evaluation import EvalSetup
    plain = build_detector('calidet/rtmdet_tiny_coco-mini.py', seed=0)
    plain_file = str(tmp_path / 'rtmdet.pth')
    save_checkpoint(dict(state_dict=plain.state_dict()), plain_file)
    cali = build_detector(RTMDET, seed=1)
    missing = cali.load_state_dict(plain.state_dict(), strict=False)
    assert not missing.unexpected_keys
    cali_file = str(tmp_path / 'cali.pth')
    save_checkpoint(dict(state_dict=cali.state_dict()), cali_file)
    configs = osp.join(
        osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
        'configs', 'calidet')
    setup = EvalSetup(
        osp.join(configs, 'calidet_rtmdet_tiny_coco-mini.py'),
        cali_file,
        baseline_config=osp.join(configs, 'rtmdet_tiny_coco-mini.py'),
        baseline_checkpoint=plain_file,
        posthoc=['reweight'],
        max_images=2,
        progress=False)
    assert isinstance(setup.cache, FeatureCache) and len(setup.cache) == 2
    assert setup.info['shared_cache'] is True
    names = [m.name for m in setup.methods]
    assert names == ['CaliRTMDet', 'RTMDet', 'RTMDet + marginal re-weighting']
    assert all(
        isinstance(m.rescorer, HeadRescorer)
        and m.rescorer.cache is setup.cache for m in setup.methods)
    alone = setup.methods[1].rescorer.predict()
    reweighted = setup.methods[2].rescorer.predict(setup.train_prior)
    assert len(reweighted) == len(alone) == 2
    for a, b in zip(reweighted, alone):
        torch.testing.assert_close(a.scores, b.scores)
