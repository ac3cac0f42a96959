# Copyright (c) mmcalidet contributors. All rights reserved.
import copy
import re

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import load_checkpoint, save_checkpoint

from mmcalidet.priors import (default_prior_path, flat_prior, load_prior,
                              model_classes, sample_prior, save_prior)
from testing import (build_detector, captured_log, demo_batch, eval_inputs,
                     get_config)
from testing import random_prior as make_random_prior
from testing import train_steps

K = 80
register_all_modules()


def build(name='calidet/calidet_dino_tiny_coco-mini.py', seed=0, **model):
    return build_detector(name, seed, **model)


@pytest.fixture(scope='module')
def model():
    return build()


def random_prior(seed):
    return make_random_prior(seed, K)


def test_default_prior_is_the_config_prior(model):
    assert model.get_prior().shape == (K, K)
    np.testing.assert_allclose(
        model.get_prior(),
        load_prior(default_prior_path('coco2017_train')),
        atol=1e-6)
    np.testing.assert_array_equal(
        build('calidet/calidet_dino_tiny_coco-mini.py',
              prior=None).get_prior(), flat_prior(K))


def test_loss_without_and_with_gt():
    model = build()
    model.train()
    for labels in ([[]], [[2]]):
        data = model.data_preprocessor(demo_batch(labels, size=64), True)
        losses = model.loss(data['inputs'], data['data_samples'])
        assert {'loss_loma', 'd0.loss_loma'} <= set(losses)
        for key, loss in losses.items():
            value = loss.item()
            if not labels[0]:
                if 'bbox' in key or 'iou' in key or 'dn' in key or \
                        'loma' in key:
                    # no GT: no box loss, and E_x = E0 gives no LoMa
                    assert value == 0, key
                elif 'cls' in key:
                    assert value > 0, key
            elif 'loma' not in key:
                assert value > 0, key
        if labels[0]:
            prior = data['data_samples'][0].prior
            assert not torch.allclose(prior, torch.full_like(prior, 0.5))
            assert losses['loss_loma'].item() != 0


def test_scores_follow_the_prior_boxes_and_hidden_states_do_not(model):
    model.eval()
    inputs, samples = eval_inputs(model)
    outs, hidden = [], []
    with torch.no_grad():
        feats = model.extract_feat(inputs)
        for seed in (1, 2):
            model.set_prior(random_prior(seed))
            head_inputs = model.forward_transformer(feats, samples)
            hidden.append(head_inputs['hidden_states'])
            outs.append(model._forward(inputs, samples))
    assert torch.equal(hidden[0], hidden[1])
    (cls1, box1), (cls2, box2) = outs
    assert cls1.shape[:2] == (2, 2)  # decoder layers, batch
    assert torch.equal(box1, box2)
    assert not torch.allclose(cls1, cls2, atol=1e-3)


def test_encoder_proposals_do_not_depend_on_the_prior():
    model = build()
    model.train()
    batch = demo_batch([[1, 2]], size=64)
    enc = []
    for seed in (1, 2):
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        data['data_samples'][0].prior = torch.tensor(
            random_prior(seed), dtype=torch.float32)
        torch.manual_seed(0)  # same denoising queries
        feats = model.extract_feat(data['inputs'])
        head_inputs = model.forward_transformer(feats, data['data_samples'])
        enc.append(head_inputs['enc_outputs_class'])
        assert head_inputs['priors'].shape == (1, K, K)
    assert torch.equal(enc[0], enc[1])


def test_sample_prior_overrides_the_model_prior(model):
    model.eval()
    inputs, samples = eval_inputs(model)
    special = random_prior(5)
    with torch.no_grad():
        model.set_prior(random_prior(6))
        default_cls, _ = model._forward(inputs, samples)
        model.set_prior(special)
        special_cls, _ = model._forward(inputs, samples)
        model.set_prior(random_prior(6))
        samples[0].prior = torch.tensor(special, dtype=torch.float32)
        mixed_cls, _ = model._forward(inputs, samples)
    torch.testing.assert_close(
        mixed_cls[:, 0], special_cls[:, 0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        mixed_cls[:, 1], default_cls[:, 1], atol=1e-4, rtol=1e-4)
    samples[1].prior = np.eye(3)
    with pytest.raises(ValueError, match='80 x 80'):
        model._forward(inputs, samples)


def test_predict_uses_the_prior(model):
    model.eval()
    inputs, samples = eval_inputs(model)
    with torch.no_grad():
        model.set_prior(sample_prior(K, [1, 2]))
        first = model.predict(inputs, copy.deepcopy(samples))
        model.set_prior(random_prior(3))
        second = model.predict(inputs, copy.deepcopy(samples))
    assert len(first[0].pred_instances) == 30
    assert not torch.allclose(first[0].pred_instances.scores,
                              second[0].pred_instances.scores)


def test_set_prior_validates_before_changing_anything(model, tmp_path):
    model.set_prior(random_prior(7))
    before = model.get_prior()
    bad = [
        np.eye(3),
        np.full((K, K), 1.5),
        np.zeros((K, K)),
        np.full((K, K), np.nan), 'no_such_prior',
        str(tmp_path / 'x.json')
    ]
    for prior in bad:
        with pytest.raises(ValueError):
            model.set_prior(prior)
        np.testing.assert_array_equal(model.get_prior(), before)
    model.set_prior(None)
    np.testing.assert_array_equal(model.get_prior(), flat_prior(K))
    model.set_prior(torch.tensor(random_prior(7)))
    np.testing.assert_allclose(model.get_prior(), before)


def test_prior_files_are_reordered_by_class_name(tmp_path):
    model = build(prior=None)
    # the dataset's classes: the config's EdgeSampler prior has these names
    classes = load_prior(
        default_prior_path('coco2017_train'), return_meta=True)[1]['classes']
    prior = random_prior(8)
    order = np.random.default_rng(0).permutation(K)
    path = save_prior(
        tmp_path / 'shuffled.json',
        prior[np.ix_(order, order)],
        classes=[classes[k] for k in order])
    model.dataset_meta = dict(classes=classes)
    model.set_prior(path)
    np.testing.assert_allclose(model.get_prior(), prior, atol=1e-7)
    # or by the classes given at construction; the EdgeSampler, which
    # gives no prior of its own here, takes the model's as E_t
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.model.update(prior=path, classes=classes)
    assert 'prior' not in cfg.model.data_preprocessor.batch_augments[0]
    built = MODELS.build(cfg.model)
    np.testing.assert_allclose(built.get_prior(), prior, atol=1e-7)
    np.testing.assert_allclose(
        built.edge_samplers()[0][1].dataset_prior, prior, atol=1e-7)
    model.dataset_meta = dict(classes=classes[:-1] + ['unknown'])
    with pytest.raises(ValueError, match='unknown'):
        model.set_prior(path)
    np.testing.assert_allclose(model.get_prior(), prior, atol=1e-7)


def test_model_classes_prefers_dataset_meta_to_the_built_classes():
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.model.update(prior=None, classes=[f'c{k}' for k in range(K)])
    model = MODELS.build(cfg.model)
    assert model_classes(model) == [f'c{k}' for k in range(K)]
    model.dataset_meta = dict(classes=[f'd{k}' for k in range(K)])
    assert model_classes(model) == [f'd{k}' for k in range(K)]
    # a plain detector: its dataset_meta or nothing
    plain = torch.nn.Linear(1, 1)
    assert model_classes(plain) is None
    plain.dataset_meta = dict(classes=('a', 'b'))
    assert model_classes(plain) == ['a', 'b']


def count_califormer_calls(model):
    calls = []
    handle = model.bbox_head.califormer.register_forward_hook(
        lambda *args: calls.append(1))
    return calls, handle


def test_cali_vectors_are_cached_until_the_prior_or_weights_change():
    model = build()
    model.eval()
    inputs, samples = eval_inputs(model)
    calls, handle = count_califormer_calls(model)
    with torch.no_grad():
        first = model.deployment_cali_vectors()
        model._forward(inputs, samples)
        model.predict(inputs, copy.deepcopy(samples))
        assert model.deployment_cali_vectors() is first
        assert len(calls) == 1
        model.set_prior(random_prior(9))
        second = model.deployment_cali_vectors()
        assert len(calls) == 2 and not torch.equal(first, second)
        # an in-place update of CaliFormer's weights (an optimizer step)
        model.bbox_head.califormer.nodes.add_(0.1)
        third = model.deployment_cali_vectors()
        assert len(calls) == 3 and not torch.equal(second, third)
        # loading a state dict (e.g. another checkpoint's prior)
        state = copy.deepcopy(model.state_dict())
        state['prior'] = torch.tensor(random_prior(10), dtype=torch.float32)
        model.load_state_dict(state)
        fourth = model.deployment_cali_vectors()
        assert len(calls) == 4 and not torch.equal(third, fourth)
        model.deployment_cali_vectors()
        assert len(calls) == 4
    # with gradients on, V' is computed with its graph every time
    v = model.deployment_cali_vectors()
    assert v.requires_grad and len(calls) == 5
    handle.remove()


@pytest.mark.slow
def test_training_reduces_the_loss():
    history = train_steps(
        build(), demo_batch([[1, 2], [3, 3]], size=64, seed=1), steps=8)
    assert np.mean(history[-2:]) < 0.7 * np.mean(history[:2]), history


def test_checkpoint_reloads_and_predicts_identically(tmp_path):
    model = build(seed=1)
    model.set_prior(random_prior(11))  # carried by the checkpoint
    with torch.no_grad():
        model.bbox_head.califormer.nodes.normal_()
    path = str(tmp_path / 'tiny.pth')
    save_checkpoint(
        dict(
            state_dict=model.state_dict(),
            meta=dict(dataset_meta=dict(classes=['a']), seed=np.int64(1))),
        path)
    reloaded = build(seed=2)
    load_checkpoint(reloaded, path, map_location='cpu', strict=True)
    np.testing.assert_array_equal(reloaded.get_prior(), model.get_prior())
    model.eval()
    reloaded.eval()
    inputs, samples = eval_inputs(model)
    with torch.no_grad():
        a = model.predict(inputs, copy.deepcopy(samples))
        b = reloaded.predict(inputs, copy.deepcopy(samples))
    for x, y in zip(a, b):
        assert torch.equal(x.pred_instances.scores, y.pred_instances.scores)
        assert torch.equal(x.pred_instances.bboxes, y.pred_instances.bboxes)
        assert torch.equal(x.pred_instances.labels, y.pred_instances.labels)


def test_dino_checkpoint_loads_with_a_report_of_the_new_keys(tmp_path):
    dino = build('calidet/dino_tiny_coco-mini.py', seed=3)
    path = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), path)
    model = build(seed=4)
    with captured_log() as lines:
        load_checkpoint(
            model, path, map_location='cpu', strict=False, logger='current')
    report = '\n'.join(lines)
    assert 'missing keys in source state_dict' in report
    assert 'bbox_head.califormer.nodes' in report and 'prior' in report
    assert 'unexpected key' not in report
    dino_state = dino.state_dict()
    for key, value in model.state_dict().items():
        if key in dino_state:
            assert torch.equal(value, dino_state[key]), key
        else:
            assert key == 'prior' or key.startswith('bbox_head.califormer.')


def test_needs_a_calibrated_head():
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    head = cfg.model.bbox_head
    for key in ('califormer', 'rho', 'loss_loma'):
        head.pop(key)
    head.type = 'DINOHead'
    with pytest.raises(TypeError, match='calibrated bbox_head'):
        MODELS.build(cfg.model)


def test_edge_sampler_classes_are_checked_at_build():
    # a 3-class head whose EdgeSampler was left at 80 fails at build time,
    # naming both settings (not at the first iteration with a shape error)
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.model.bbox_head.num_classes = 3
    cfg.model.prior = None
    cfg.model.data_preprocessor.batch_augments[0].num_classes = 80
    with pytest.raises(
            ValueError,
            match=re.escape('model.data_preprocessor.batch_augments[0] '
                            '(EdgeSampler) has num_classes=80 but '
                            'model.bbox_head.num_classes=3')):
        MODELS.build(copy.deepcopy(cfg.model))
    sampler = cfg.model.data_preprocessor.batch_augments[0]
    sampler.num_classes = 3
    sampler.prior = None
    sampler.mode_probs = dict(sample=1.0, batch=1.0, dataset=0.0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    assert [(i, s.num_classes) for i, s in model.edge_samplers()] == [(0, 3)]


def test_edge_sampler_takes_k_and_e_t_from_the_detector(tmp_path):
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    sampler_cfg = cfg.model.data_preprocessor.batch_augments[0]
    # the configs state both once, in the detector
    assert 'num_classes' not in sampler_cfg and 'prior' not in sampler_cfg
    assert cfg.model.prior == 'coco2017_train'
    model = MODELS.build(copy.deepcopy(cfg.model))
    sampler = model.edge_samplers()[0][1]
    assert sampler.num_classes == K
    np.testing.assert_array_equal(sampler.dataset_prior,
                                  load_prior(default_prior_path(
                                      'coco2017_train')))
    # a sampler prior other than the detector's is refused, naming both
    other = tmp_path / 'other.npy'
    np.save(other, make_random_prior(3, K))
    sampler_cfg.prior = str(other)
    with pytest.raises(
            ValueError,
            match=re.escape(
                'model.data_preprocessor.batch_augments[0] (EdgeSampler) '
                f"has prior='{other}' but model.prior='coco2017_train'")):
        MODELS.build(copy.deepcopy(cfg.model))
    # the same matrix given twice (a file and a matrix) is no conflict
    sampler_cfg.prior = load_prior(default_prior_path('coco2017_train'))
    MODELS.build(copy.deepcopy(cfg.model))
    # without E_t anywhere the detector builds (E0 at deployment), and
    # training with the "dataset" mode stops at the first batch
    sampler_cfg.pop('prior')
    cfg.model.prior = None
    model = MODELS.build(copy.deepcopy(cfg.model))
    with pytest.raises(ValueError, match='"dataset" mode needs a prior'):
        model.data_preprocessor(demo_batch([[1]], size=64), True)


def three_class_config(prior):
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    cfg.model.bbox_head.num_classes = 3
    cfg.model.prior = prior
    cfg.model.data_preprocessor.batch_augments[0].update(
        num_classes=3, prior=prior)
    return cfg


def test_named_priors_follow_the_dataset_class_order(tmp_path):
    # the prior file lists the classes in another order than the dataset
    classes = ['cat', 'dog', 'bird']
    file_order = [2, 0, 1]  # bird, cat, dog
    prior = np.array([[1.0, 0.2, 0.3], [0.4, 1.0, 0.5], [0.6, 0.7, 1.0]])
    path = save_prior(
        tmp_path / 'three.json',
        prior[np.ix_(file_order, file_order)],
        classes=[classes[k] for k in file_order])
    torch.manual_seed(0)
    model = MODELS.build(three_class_config(str(path)).model)
    sampler = model.data_preprocessor.batch_augments[0]
    # before the classes are known: the file's order
    np.testing.assert_allclose(
        model.get_prior(), prior[np.ix_(file_order, file_order)], atol=1e-7)
    # the runner sets dataset_meta: both priors take the dataset's order
    model.dataset_meta = dict(classes=classes)
    np.testing.assert_allclose(model.get_prior(), prior, atol=1e-7)
    np.testing.assert_allclose(sampler.dataset_prior, prior)
    assert sampler.prior_classes == classes
    # once matched, the prior is in the model's order: a later dataset_meta
    # (e.g. an evaluation set's) does not reorder it again
    model.dataset_meta = dict(classes=['dog', 'cat', 'bird'])
    np.testing.assert_allclose(model.get_prior(), prior, atol=1e-7)

    # a prior whose class names are not the dataset's is rejected, and
    # nothing changes
    model = MODELS.build(three_class_config(str(path)).model)
    before = model.get_prior()
    with pytest.raises(ValueError, match=r'three\.json.*model\.prior'):
        model.dataset_meta = dict(classes=['cat', 'dog', 'fish'])
    np.testing.assert_array_equal(model.get_prior(), before)
    with pytest.raises(AttributeError):
        model.dataset_meta
    # the EdgeSampler's prior is checked too
    cfg = three_class_config(str(path))
    cfg.model.prior = None
    model = MODELS.build(copy.deepcopy(cfg.model))
    with pytest.raises(
            ValueError,
            match=r'batch_augments\[0\]: EdgeSampler: .*three\.json'):
        model.dataset_meta = dict(classes=['cat', 'dog', 'fish'])


def test_checkpoint_priors_are_not_reordered(tmp_path):
    classes = ['cat', 'dog', 'bird']
    prior = np.array([[1.0, 0.2, 0.3], [0.4, 1.0, 0.5], [0.6, 0.7, 1.0]])
    path = save_prior(
        tmp_path / 'three.json', prior, classes=['bird', 'cat', 'dog'])
    cfg = three_class_config(str(path))
    torch.manual_seed(0)
    trained = MODELS.build(copy.deepcopy(cfg.model))
    trained.dataset_meta = dict(classes=classes)
    ckpt = str(tmp_path / 'model.pth')
    save_checkpoint(dict(state_dict=trained.state_dict()), ckpt)
    # as mmdet's init_detector: build, load, then set the dataset_meta
    model = MODELS.build(copy.deepcopy(cfg.model))
    load_checkpoint(model, ckpt, map_location='cpu')
    model.dataset_meta = dict(classes=classes)
    np.testing.assert_array_equal(model.get_prior(), trained.get_prior())


@pytest.mark.slow
def test_training_matches_named_priors_to_the_dataset_classes(tmp_path):
    # mmengine's runner never sets the model's dataset_meta: the config's
    # PriorClassesHook matches the named priors before the first step
    from mmengine.runner import Runner
    prior, meta = load_prior(
        default_prior_path('coco2017_train'), return_meta=True)
    classes = meta['classes']
    order = np.random.default_rng(0).permutation(len(classes))
    path = save_prior(
        tmp_path / 'shuffled.json',
        prior[np.ix_(order, order)],
        classes=[classes[k] for k in order])
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py', prior=path)
    cfg.work_dir = str(tmp_path / 'work')
    # val_begin past the end: no validation after the last iteration
    cfg.train_cfg.update(max_iters=1, val_interval=100, val_begin=100)
    cfg.default_hooks.checkpoint.interval = 100
    cfg.train_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.randomness = dict(seed=0)  # the same run every time
    runner = Runner.from_cfg(cfg)
    model = runner.model
    sampler = model.data_preprocessor.batch_augments[0]
    shuffled = prior[np.ix_(order, order)]
    np.testing.assert_allclose(model.get_prior(), shuffled, atol=1e-6)
    np.testing.assert_allclose(sampler.dataset_prior, shuffled)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic on every machine
    try:
        runner.train()
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(model.get_prior(), prior, atol=1e-6)
    np.testing.assert_allclose(sampler.dataset_prior, prior)


def _runner_of(model, classes):
    """What PriorClassesHook reads of a runner: the model and the training
    dataset (here wrapped, as a ConcatDataset-like wrapper holds it)."""
    from types import SimpleNamespace
    dataset = SimpleNamespace(
        metainfo={}, dataset=SimpleNamespace(metainfo=dict(classes=classes)))
    return SimpleNamespace(
        model=model, train_dataloader=SimpleNamespace(dataset=dataset))


def test_prior_classes_hook_matches_or_rejects_named_priors(tmp_path):
    from mmcalidet.engine import PriorClassesHook
    path = save_prior(
        tmp_path / 'three.json',
        np.array([[1.0, 0.2, 0.3], [0.4, 1.0, 0.5], [0.6, 0.7, 1.0]]),
        classes=['bird', 'cat', 'dog'])
    torch.manual_seed(0)
    model = MODELS.build(three_class_config(str(path)).model)
    model.init_weights()  # mmdet leaves some parameters uninitialised
    sampler = model.data_preprocessor.batch_augments[0]
    # without the hook (or dataset_meta), as mmdet's own tests build a
    # model: the sampler and the detector warn once and read the prior in
    # its file's order
    torch.manual_seed(0)
    untrained = MODELS.build(three_class_config(str(path)).model)
    untrained.init_weights()
    with pytest.warns(UserWarning) as caught:
        train_steps(untrained, demo_batch([[0], [1]]), steps=1)
    texts = [str(w.message) for w in caught]
    assert any(re.search(r'EdgeSampler.*three\.json.*own class order', t)
               for t in texts), texts
    assert any(re.search(r'three\.json.*model\.prior.*own class order', t)
               for t in texts), texts
    # classes of another count are not this model's: nothing changes
    PriorClassesHook().before_train(_runner_of(model, ['a', 'b']))
    assert sampler.prior_classes == ['bird', 'cat', 'dog']
    # other names: refused, naming the file, and nothing changed
    with pytest.raises(ValueError, match=r'three\.json.*prior.*fish'):
        PriorClassesHook().before_train(
            _runner_of(model, ['cat', 'dog', 'fish']))
    assert sampler.prior_classes == ['bird', 'cat', 'dog']
    # the dataset's order: both priors reordered, and training runs
    PriorClassesHook().before_train(
        _runner_of(model, ['dog', 'cat', 'bird']))
    expected = np.array([[1.0, 0.7, 0.6], [0.5, 1.0, 0.4], [0.3, 0.2, 1.0]])
    np.testing.assert_allclose(model.get_prior(), expected, atol=1e-7)
    np.testing.assert_allclose(sampler.dataset_prior, expected)
    train_steps(model, demo_batch([[0], [1]]), steps=1)
    # a plain detector is left alone
    PriorClassesHook().before_train(_runner_of(torch.nn.Linear(1, 1), []))
