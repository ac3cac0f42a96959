# Copyright (c) mmcalidet contributors. All rights reserved.
"""The evaluation's priors carry their support to a CaliFormer that reads
it (experimental option): a registered prior is scored as ``set_prior``
with that support scores it in a full forward; others as before."""
import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

from mmcalidet.evaluation import Rescorer, cache_hidden_states
from mmcalidet.evaluation.prior_support import register_label_supports
from mmcalidet.models.layers.support_ops import label_support
from mmcalidet.priors import Prior, batch_prior, sample_prior
from testing import get_config

K = 80


def build(support: bool):
    init_default_scope('mmdet')
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.test_dataloader.dataset.indices = 3
    cfg.test_dataloader.dataset.pipeline[1].scale = (96, 96)
    cfg.test_dataloader.batch_size = 3
    cali = cfg.model.bbox_head.califormer
    cali.update(zero_init_output=False)
    if support:
        cali.update(support_features=True, lift_bias=True)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    if support:  # the zero-initialised branches, made to matter
        former = model.bbox_head.califormer
        with torch.no_grad():
            former.support_proj.weight.normal_(std=1.0)
            former.support_proj.bias.normal_(std=1.0)
            former.lift_scale.fill_(2.0)
    loader = Runner.build_dataloader(cfg.test_dataloader)
    model.dataset_meta = dict(loader.dataset.metainfo)
    return model.eval(), loader


@pytest.fixture(scope='module')
def with_support():
    model, loader = build(True)
    return model, loader, cache_hidden_states(model, loader, progress=False)


def site_prior_and_support():
    rng = np.random.default_rng(0)
    lists = [rng.choice(K, size=3, replace=False) for _ in range(20)]
    return batch_prior(K, lists), lists


def full_scores(model, loader):
    with torch.no_grad():
        return [
            ds.pred_instances.scores for batch in loader
            for ds in model.test_step(batch)
        ]


def test_registered_prior_scores_as_set_prior_with_its_support(
        with_support):
    model, loader, cache = with_support
    prior, lists = site_prior_and_support()
    support, marginals = label_support(lists, K)
    rescorer = Rescorer(model, cache)
    assert rescorer.reads_support
    before = [r.scores for r in rescorer.predict(prior)]
    rescorer.register_support(prior, support, marginals)
    after = [r.scores for r in rescorer.predict(prior)]
    saved = model.get_prior()
    try:
        model.set_prior(prior, support=support, marginals=marginals)
        full = full_scores(model, loader)
        model.set_prior(prior)
        full_without = full_scores(model, loader)
    finally:
        model.set_prior(saved)
    for a, b, c, d in zip(after, full, before, full_without):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(c, d, atol=1e-6, rtol=0)
    # the support matters for this model (else the equalities prove little)
    assert any(not torch.allclose(a, c) for a, c in zip(after, before))


def test_stack_rows_take_their_own_support(with_support):
    """Per-image priors: each registered row is scored with its own
    support, an unregistered row without, as if each were shared."""
    model, _, cache = with_support
    labels = cache.gt_label_lists()
    rescorer = Rescorer(model, cache, batch_size=2)
    count = register_label_supports(rescorer, labels[:2])
    assert count == 1 + 2  # E_v, then each image's E_x
    stack = np.stack([sample_prior(K, lab) for lab in labels])
    stacked = rescorer.predict(stack)
    for i, res in enumerate(stacked):
        alone = rescorer.predict(stack[i], indices=[i])[0]
        torch.testing.assert_close(res.scores, alone.scores, atol=1e-6,
                                   rtol=0)
    # image 2's E_x was not registered: scored as by a scorer without any
    fresh = Rescorer(model, cache).predict(stack[2], indices=[2])[0]
    torch.testing.assert_close(stacked[2].scores, fresh.scores, atol=1e-6,
                               rtol=0)


def test_label_support_and_a_model_without_the_option():
    lists = [np.array([0, 2, 2]), np.array([2]), np.array([], dtype=int)]
    n, p = label_support(lists, 4)
    np.testing.assert_array_equal(n, [3, 3, 3, 3])
    np.testing.assert_allclose(p, [1 / 3, 0, 2 / 3, 0])
    n, p = label_support([], 4)
    np.testing.assert_array_equal(n, 0)
    np.testing.assert_array_equal(p, 0)
    model, loader = build(False)
    cache = cache_hidden_states(model, loader, progress=False)
    rescorer = Rescorer(model, cache)
    assert not rescorer.reads_support
    prior, lists = site_prior_and_support()
    assert register_label_supports(rescorer, cache.gt_label_lists(),
                                   sites={'s': (prior, [0, 1])}) == 0
    assert rescorer._supports == {}


def test_bad_support_is_refused(with_support):
    model, _, cache = with_support
    rescorer = Rescorer(model, cache)
    prior, lists = site_prior_and_support()
    support, marginals = label_support(lists, K)
    with pytest.raises(ValueError, match='support must have shape'):
        rescorer.register_support(prior, support[:3], marginals)
    with pytest.raises(ValueError, match='marginals must lie in'):
        rescorer.register_support(prior, support, marginals + 1)
    with pytest.raises(ValueError, match='expected priors of shape'):
        rescorer.register_support(prior[:3], support, marginals)
    assert rescorer._supports == {}


def test_sweep_priors_move_the_shares_with_the_prior(with_support):
    from mmcalidet.priors import shrink
    model, _, cache = with_support
    labels = cache.gt_label_lists()
    rng = np.random.default_rng(1)
    train_lists = [rng.choice(K, size=3, replace=False) for _ in range(50)]
    train_prior = batch_prior(K, train_lists)
    n_t, p_t = label_support(train_lists, K)
    classes = [f'c{i}' for i in range(K)]
    train = Prior(train_prior, classes, n_t, p_t)
    site, idx = site_prior_and_support()[0], [0, 1]
    rescorer = Rescorer(model, cache)
    count = register_label_supports(
        rescorer, labels, train,
        sites={'s': (site, idx)}, sweep_alphas=(-1.0, 0.0, 0.5, 1.0))
    # E_t, three sweep priors (alpha 0 is E_t), E_v, E_site, 3 E_x
    assert count == 1 + 3 + 1 + 1 + 3
    n_s, p_s = label_support([labels[i] for i in idx], K)
    key = torch.as_tensor(shrink(train_prior, site, 0.5),
                          dtype=torch.float32).numpy().tobytes()
    n, p = rescorer._supports[key]
    np.testing.assert_allclose(n.numpy(), n_s)
    np.testing.assert_allclose(p.numpy(), (p_t + 0.5 * (p_s - p_t)),
                               atol=1e-6)
    key_t = torch.as_tensor(train_prior, dtype=torch.float32).numpy()
    np.testing.assert_allclose(rescorer._supports[key_t.tobytes()][0], 50)


def test_self_calibration_keeps_the_start_prior_support(with_support):
    """Every E_c of the batch loop is scored with the start's support, as
    a Rescorer with that support registered scores it."""
    from mmcalidet.calibration import self_calibrate
    model, _, cache = with_support
    prior, lists = site_prior_and_support()
    support = label_support(lists, K)
    result = self_calibrate(
        model, cache, iters=2, tol=0, score_thr=0.0, init_prior=prior,
        init_support=support, trust_radius=0.05)
    rescorer = Rescorer(model, cache)
    without = [r.scores for r in rescorer.predict(result.prior)]
    rescorer.register_support(result.prior, *support)
    with_start_support = [r.scores for r in rescorer.predict(result.prior)]
    for got, want, other in zip(result.predictions, with_start_support,
                                without):
        torch.testing.assert_close(got.scores, want)
        assert not torch.allclose(got.scores, other)
    assert rescorer.support_of(result.prior)[0].tolist() == [20.0] * K


def test_online_calibrator_injects_the_start_support(with_support):
    from mmcalidet.calibration import OnlineSelfCalibrator
    model, _, _ = with_support
    prior, lists = site_prior_and_support()
    support, share = label_support(lists, K)
    saved = model.get_prior()
    try:
        model.set_prior(prior, support=support, marginals=share)
        # from the model's deployment prior: its support comes along
        calibrator = OnlineSelfCalibrator(
            model=model, warmup=1, update_interval=1, score_thr=0.0)
        np.testing.assert_array_equal(calibrator.init_support[0], support)
        pred = dict(scores=torch.tensor([0.9, 0.8]),
                    labels=torch.tensor([1, 2]))
        assert calibrator.update([pred])
        assert not np.array_equal(model.get_prior(), prior.astype(
            np.float32)), 'E_c moved'
        got_support, got_share = model.deployment_support()
        np.testing.assert_allclose(got_support.numpy(), support)
        np.testing.assert_allclose(got_share.numpy(), share, atol=1e-6)
    finally:
        model.set_prior(saved)


def test_a_site_prior_from_labelled_images_gets_their_support(with_support):
    """fit_site_prior's candidates and deployment_gains' raw prior: n =
    the labelled images, the shares moved with the prior from E_t's."""
    from mmcalidet.calibration.cross_fitting import register_site_support
    from mmcalidet.priors import shrink
    model, _, cache = with_support
    rescorer = Rescorer(model, cache)
    train, lists = site_prior_and_support()
    labelled = lists[:5]
    estimate = batch_prior(K, labelled)
    candidate = shrink(train, estimate, 0.5)
    register_site_support(rescorer, train, candidate, labelled, 0.5)
    assert rescorer.support_of(candidate) is None, 'E_t has no support'
    train_n, train_p = label_support(lists, K)
    rescorer.register_support(train, train_n, train_p)
    register_site_support(rescorer, train, candidate, labelled, 0.5)
    n, p = rescorer.support_of(candidate)
    site_n, site_p = label_support(labelled, K)
    np.testing.assert_array_equal(n, np.full(K, 5.0))
    np.testing.assert_allclose(p, train_p + 0.5 * (site_p - train_p),
                               atol=1e-6)


def test_a_fitted_prior_file_records_the_support_it_was_scored_with(
        tmp_path):
    """alpha 0 gives E_t back, with E_t's support (not the n labelled
    images'): support_images keeps it apart from num_images."""
    from mmcalidet.calibration import SitePriorFit
    from mmcalidet.priors import Prior, load_prior
    classes = [f'c{i}' for i in range(4)]
    prior = batch_prior(4, [[0, 1], [2]])
    support = (np.full(4, 2000.0), np.array([0.5, 0.25, 0.125, 0.0]))
    fit = SitePriorFit(prior=prior, estimate=prior, alpha=0.0,
                       absent='train', num_images=32, gain=0.0, low=0.0,
                       high=0.0, folds=4, support=support)
    path = str(tmp_path / 'fitted.json')
    fit.to_prior(classes).save(path)
    _, meta = load_prior(path, return_meta=True)
    assert meta['num_images'] == 32 and meta['support_images'] == 2000
    loaded = Prior.load(path)
    np.testing.assert_array_equal(loaded.support, support[0])
    np.testing.assert_allclose(loaded.marginals, support[1])
    # without a support (a model that reads none) the file records none
    bare = SitePriorFit(prior=prior, estimate=prior, alpha=0.0,
                        absent='train', num_images=32, gain=0.0, low=0.0,
                        high=0.0, folds=4)
    assert not bare.to_prior(classes).has_support
    assert 'images_per_class' not in bare.to_prior(classes).file_keys()
