# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet.apis.init_detector / inference_detector with a prior."""
import copy

import mmcv
import numpy as np
import pytest
import torch
from mmdet.apis import inference_detector as mmdet_inference_detector
from mmdet.datasets import CocoDataset
from mmdet.registry import MODELS
from mmengine.config import Config

from mmcalidet.apis import (config_classes, inference_detector, init_detector,
                            per_image_priors, resolve_call_priors)
from mmcalidet.priors import (default_prior_path, load_prior, reorder_prior,
                              save_prior)
from testing import get_config, random_prior
from testing.tolerances import assert_same_predictions

K = 80
CLASSES = list(CocoDataset.METAINFO['classes'])

#: a 10-class CaliDINO (the context-shift project's), relative to configs/
CONTEXT_SHIFT = ('../projects/context_shift/configs/'
                 'calidet_dino_tiny_context-shift.py')


def assert_same(a, b):
    """Two predictions are identical (scores, labels and boxes)."""
    a, b = a.pred_instances, b.pred_instances
    assert torch.equal(a.labels, b.labels)
    assert torch.equal(a.scores, b.scores)
    assert torch.equal(a.bboxes, b.bboxes)


@pytest.fixture(scope='module')
def model(config, checkpoint):
    return init_detector(config, checkpoint[0], device='cpu')


@pytest.fixture
def model_runs(model):
    """Counts the model's forward passes (backbone calls)."""
    calls = []
    handle = model.backbone.register_forward_pre_hook(
        lambda *args: calls.append(1))
    yield calls
    handle.remove()


def test_init_detector_builds_calidet_with_the_checkpoint_prior(
        model, config, checkpoint):
    assert type(model).__name__ == 'CaliDINO'
    assert list(model.dataset_meta['classes']) == CLASSES
    # the checkpoint's prior, not the config's coco2017_train
    np.testing.assert_allclose(model.get_prior(), checkpoint[1], atol=1e-6)
    site = init_detector(
        config, checkpoint[0], device='cpu', prior='coco2017_val')
    np.testing.assert_allclose(
        site.get_prior(),
        load_prior(default_prior_path('coco2017_val')),
        atol=1e-6)


def test_without_a_prior_it_is_mmdets_inference_detector(model, images):
    cfg = copy.deepcopy(model.cfg)
    results = []
    try:
        for img in (images[0], mmcv.imread(images[0])):
            ours = inference_detector(model, img)
            results.append(ours)
            # ours builds the pipeline from a copy of model.cfg
            assert model.cfg.test_dataloader.dataset.pipeline[0].type == \
                'LoadImageFromFile'
            assert_same(ours, mmdet_inference_detector(model, img))
    finally:  # mmdet's call with an array edits model.cfg's pipeline
        model.cfg = cfg
    batch = inference_detector(model, [images[0]])
    assert isinstance(batch, list) and len(batch) == 1
    assert_same(batch[0], results[0])


def test_a_call_prior_applies_to_that_call_only(model, images):
    before = model.get_prior()
    prior = random_prior(1)
    default = inference_detector(model, images[0])
    injected = inference_detector(model, images[0], prior=prior)
    # the prior changes the scores, never the boxes of a query
    assert not torch.allclose(default.pred_instances.scores,
                              injected.pred_instances.scores)
    np.testing.assert_array_equal(model.get_prior(), before)
    assert_same(inference_detector(model, images[0]), default)
    # set_prior changes the default: the same result as the call prior
    # (the deployed V' and a call's per-sample V' enter the logits by
    # other kernels: the scores are the same within the tight tolerance)
    model.set_prior(prior)
    try:
        assert_same_predictions(inference_detector(model, images[0]), injected)
    finally:
        model.set_prior(before)


def test_every_form_of_a_prior_gives_the_same_result(model, images, tmp_path):
    prior = random_prior(2)
    expected = torch.from_numpy(prior).float()
    # a JSON file written in another class order is reordered by name
    order = np.random.default_rng(0).permutation(K)
    shuffled = save_prior(
        tmp_path / 'shuffled.json',
        prior[np.ix_(order, order)],
        classes=[CLASSES[k] for k in order])
    npy = save_prior(tmp_path / 'prior.npy', prior)
    from mmcalidet.priors import Prior
    forms = [
        prior,
        Prior.load(shuffled),
        torch.tensor(prior),
        prior.tolist(), shuffled, npy,
        dict(classes=CLASSES, matrix=prior.tolist())
    ]
    for form in forms:
        resolved, = resolve_call_priors(model, form, 1)
        torch.testing.assert_close(
            torch.from_numpy(np.array(resolved.matrix)).float(),
            expected,
            atol=0,
            rtol=0)
    # a shipped name is the shipped file
    resolved, = resolve_call_priors(model, 'coco2017_val', 1)
    torch.testing.assert_close(
        torch.from_numpy(np.array(resolved.matrix)).float(),
        torch.from_numpy(load_prior(
            default_prior_path('coco2017_val'))).float())
    assert_same(
        inference_detector(model, images[0], prior=shuffled),
        inference_detector(model, images[0], prior=prior))
    # a list of Prior values is one per image, as a list of files is
    both = inference_detector(
        model, images[:2], prior=[Prior.load(shuffled), None])
    assert_same(both[0], inference_detector(model, images[0], prior=prior))
    assert_same(both[1], inference_detector(model, images[1]))


def test_per_image_priors_equal_separate_calls(model, images):
    prior = random_prior(3)
    # one call, two sites: the first image with its own prior, the
    # second with the model's (None)
    together = inference_detector(model, images, prior=[prior, None])
    assert_same(together[0], inference_detector(model, images[0], prior=prior))
    assert_same(together[1], inference_detector(model, images[1]))


def test_per_image_priors_are_told_from_one_matrix():
    prior = random_prior(4)
    for one in (prior, torch.tensor(prior), prior.tolist(), 'site.json',
                dict(matrix=prior.tolist())):
        assert per_image_priors(one) is None
    stacked = per_image_priors(np.stack([prior, prior]))
    assert len(stacked) == 2 and stacked[0].shape == (K, K)
    assert per_image_priors([prior.tolist(), None,
                             'a.json']) == [prior.tolist(), None, 'a.json']


def test_predictions_equal_with_and_without_the_cached_v(model, images):
    """The deployment prior's V' is computed once and reused; a call prior
    computes V' afresh. All give the same predictions."""
    calls = []
    handle = model.bbox_head.califormer.register_forward_hook(
        lambda *args: calls.append(1))
    before = model.get_prior()
    try:
        model.set_prior(random_prior(5))
        cold = inference_detector(model, images[0])
        assert len(calls) == 1
        warm = inference_detector(model, [images[0]])
        assert len(calls) == 1  # two predictions, one CaliFormer pass
        fresh = inference_detector(model, images[0], prior=random_prior(5))
        assert len(calls) == 2
    finally:
        handle.remove()
        model.set_prior(before)
    assert_same(warm[0], cold)
    assert_same_predictions(fresh, cold)  # a call's V': other kernels


def bad_priors(tmp_path):
    eye3 = np.eye(3)
    non_square = np.ones((K, K - 1))
    nan = random_prior(6)
    nan[3, 4] = np.nan
    above = random_prior(6)
    above[3, 4] = 1.5
    negative = random_prior(6)
    negative[4, 3] = -0.2
    diagonal = random_prior(6)
    diagonal[7, 7] = 0.5
    misspelt = save_prior(
        tmp_path / 'misspelt.json',
        random_prior(6),
        classes=['persn'] + CLASSES[1:])
    return [
        (eye3, 'K=3 classes, expected 80'),
        (non_square, 'square'),
        (nan, 'non-finite value nan at \\[3, 4\\]'),
        (above, '\\[0, 1\\], got 1.5 at \\[3, 4\\]'),
        (negative, '\\[0, 1\\], got -0.2 at \\[4, 3\\]'),
        (diagonal, 'diagonal must be 1'),
        (misspelt, "class 'person' is not in the prior file "
         "\\(did you mean 'persn'"),
        (str(tmp_path / 'missing.json'), 'not found'),
        ('coco2017_tarin', 'no shipped prior'),
    ]


def bad_per_image_priors():
    return [
        ([random_prior(6)] * 3, '3 priors for 2 images'),
        ([random_prior(6), np.eye(3)], 'prior of image 1: .*K=3'),
    ]


def test_bad_priors_are_rejected_before_the_model_runs(model, images,
                                                       model_runs, tmp_path):
    before = model.get_prior()
    for prior, message in bad_priors(tmp_path):
        with pytest.raises(ValueError, match=message):
            inference_detector(model, images, prior=prior)
        with pytest.raises(ValueError, match=message):
            model.set_prior(prior)
        np.testing.assert_array_equal(model.get_prior(), before)
    for prior, message in bad_per_image_priors():
        with pytest.raises(ValueError, match=message):
            inference_detector(model, images, prior=prior)
    np.testing.assert_array_equal(model.get_prior(), before)
    assert not model_runs
    # a diagonal that is not 1 is accepted when asked to reset it
    diagonal = random_prior(6)
    diagonal[7, 7] = 0.5
    reset = load_prior(diagonal, reset_diagonal=True)
    inference_detector(model, images[0], prior=reset)
    assert len(model_runs) == 1


def test_a_plain_detector_takes_no_prior(images):
    cfg = get_config('calidet/dino_tiny_coco-mini.py')
    dino = MODELS.build(cfg.model)
    dino.init_weights()
    with pytest.raises(ValueError, match='calibratable detector'):
        inference_detector(dino, images[0], prior=random_prior(7))


@pytest.mark.parametrize('name', [
    'classes20', 'plain_dino', 'nan_prior', 'empty', 'truncated', 'text'
])
def test_init_detector_refuses_a_checkpoint_that_does_not_fit(
        config, bad_checkpoints, name):
    path, error, message = bad_checkpoints[name]
    with pytest.raises(error) as info:
        init_detector(config, path, device='cpu')
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    assert '\n' not in text
    if name == 'empty':
        assert text == f'checkpoint is empty: {path}'
    else:
        assert text.startswith(f'checkpoint {path} {message}'), text


def test_init_detector_without_a_checkpoint_initialises_the_weights(config):
    torch.manual_seed(0)
    model = init_detector(config, None, device='cpu')
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
    # mmdet creates level_embed uninitialised (torch.Tensor(...): NaN or
    # 1e35 seen); init_weights draws it from N(0, 1)
    assert model.level_embed.numel() == 4 * 256
    assert 0.8 < float(model.level_embed.std()) < 1.2
    assert float(model.level_embed.abs().max()) < 6


def test_init_detector_without_a_checkpoint_names_the_configs_classes():
    # mmdet names COCO's 80 classes when there is no checkpoint; a 10-class
    # CaliDet config with a named prior failed to build ("class 'person' is
    # not in the prior file"). Now its dataset_meta names the config's
    # classes and the prior (class names in another order) is reordered.
    cfg = get_config(CONTEXT_SHIFT)
    names = list(reversed(cfg.classes))
    matrix = random_prior(3, 10)
    cfg.model.prior = dict(classes=names, matrix=matrix.tolist())
    model = init_detector(cfg, None, device='cpu')
    assert model.dataset_meta['classes'] == list(cfg.classes)
    assert config_classes(cfg) == list(cfg.classes)
    np.testing.assert_allclose(
        model.get_prior(),
        reorder_prior(matrix, names, list(cfg.classes)),
        atol=1e-6)
    assert not np.allclose(model.get_prior(), matrix, atol=1e-3)


def test_config_classes_reads_wrapped_datasets_and_may_find_none():
    cfg = Config(
        dict(
            train_dataloader=dict(
                dataset=dict(
                    type='RepeatDataset',
                    dataset=dict(metainfo=dict(classes=('a', 'b')))))))
    assert config_classes(cfg) == ['a', 'b']
    assert config_classes(Config(dict(test_dataloader=dict()))) is None


def test_init_detector_with_a_state_dict_checkpoint_names_the_configs_classes(
        tmp_path):
    # a hand-saved dict(state_dict=...) names no classes: mmdet's
    # init_detector names COCO's 80 for a 10-class model; ours takes the
    # config's, and a checkpoint whose meta names classes keeps them
    cfg = get_config(CONTEXT_SHIFT)
    cfg.model.prior = random_prior(4, 10).tolist()  # no class names
    model = init_detector(cfg, None, device='cpu')
    bare = str(tmp_path / 'state_dict.pth')
    torch.save(dict(state_dict=model.state_dict()), bare)
    loaded = init_detector(cfg, bare, device='cpu')
    assert loaded.dataset_meta['classes'] == list(cfg.classes)
    named = str(tmp_path / 'with_meta.pth')
    classes = [f'c{i}' for i in range(10)]
    torch.save(
        dict(
            state_dict=model.state_dict(),
            meta=dict(dataset_meta=dict(classes=classes))), named)
    assert init_detector(cfg, named,
                         device='cpu').dataset_meta['classes'] == classes


def test_init_detector_reads_the_checkpoint_file_twice(config, checkpoint,
                                                       monkeypatch):
    # once memory-mapped for the class names and the fit checks, once by
    # mmdet's own load of the weights (it used to be read three times)
    reads = []
    load = torch.load

    def counting_load(f, *args, **kwargs):
        reads.append((str(f), bool(kwargs.get('mmap'))))
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, 'load', counting_load)
    init_detector(config, checkpoint[0], device='cpu')
    mine = [mmap for f, mmap in reads if f == str(checkpoint[0])]
    assert sorted(mine) == [False, True]


def test_init_detector_with_an_empty_dataset_meta(tmp_path):
    """A checkpoint whose meta holds an empty ``dataset_meta``: the
    config's classes, else COCO's with a warning (as mmdet), never a
    KeyError."""
    cfg = get_config(CONTEXT_SHIFT)
    cfg.model.prior = random_prior(4, 10).tolist()  # no class names
    model = init_detector(cfg, None, device='cpu')
    empty = str(tmp_path / 'empty_meta.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict(dataset_meta={})),
               empty)
    assert init_detector(cfg, empty,
                         device='cpu').dataset_meta['classes'] == list(
                             cfg.classes)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.pop('metainfo', None)
    with pytest.warns(UserWarning, match='COCO'):
        loaded = init_detector(cfg, empty, device='cpu')
    assert len(loaded.dataset_meta['classes']) == 80
