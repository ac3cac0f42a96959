# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior travels whole (matrix, class names, support, marginals) through
the model, its checkpoints, an edit and the baselines, or is refused in one
line that names the key: the audit's silently wrong cases."""
import json

import numpy as np
import pytest
import torch

from mmcalidet.apis import init_detector
from mmcalidet.priors import Prior, default_prior_path, save_prior
from mmcalidet.utils.checkpoint_compat import CheckpointError
from testing import get_config, random_prior

CONFIG = 'calidet/calidet_dino_tiny_coco-mini_cached.py'
K = 80


def support_config(prior='coco2017_train'):
    """A support-aware CaliDINO (its CaliFormer reads a prior's support)
    whose E_t is a named prior (the model's classes unknown at build)."""
    cfg = get_config(CONFIG)
    cfg.model.bbox_head.califormer.update(
        support_features=True, lift_bias=True, zero_init_output=False)
    cfg.model.prior = prior
    return cfg


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """(config, a checkpoint without the support keys, its state)."""
    cfg = support_config()
    torch.manual_seed(0)
    model = init_detector(cfg, None, device='cpu')
    state = {
        k: v
        for k, v in model.state_dict().items()
        if k not in ('prior_support', 'prior_marginals')
    }
    meta = dict(dataset_meta=dict(model.dataset_meta))
    folder = tmp_path_factory.mktemp('ckpt')
    path = str(folder / 'no_support.pth')
    torch.save(dict(state_dict=state, meta=meta), path)
    return cfg, path, state, meta, folder


def e_t_support(classes):
    e_t = Prior.load('coco2017_train', classes=classes)
    return torch.from_numpy(np.array(e_t.support)).float(), \
        torch.from_numpy(np.array(e_t.marginals)).float()


def test_a_checkpoint_without_a_support_keeps_the_configured_one(saved):
    """Its prior is the config's E_t: init_detector loaded it with no
    support (the checkpoint was read before the file's support was
    matched to the classes)."""
    cfg, path, _, _, _ = saved
    model = init_detector(cfg, path, device='cpu')
    support, marginals = model.deployment_support()
    assert support is not None, 'the support of E_t is kept'
    expected = e_t_support(model.dataset_meta['classes'])
    torch.testing.assert_close(support, expected[0])
    torch.testing.assert_close(marginals, expected[1])


def test_a_checkpoint_of_another_prior_without_a_support_has_none(saved):
    cfg, _, state, meta, folder = saved
    other = dict(state, prior=torch.from_numpy(random_prior(3, K)).float())
    path = str(folder / 'other.pth')
    torch.save(dict(state_dict=other, meta=meta), path)
    model = init_detector(cfg, path, device='cpu')
    assert model.deployment_support() == (None, None)
    np.testing.assert_allclose(
        model.get_prior(), random_prior(3, K), atol=1e-6)


@pytest.mark.parametrize('extra, match', [
    (dict(prior_support=torch.full((K, ), 5.0)),
     'saves prior_support without prior_marginals'),
    (dict(prior_marginals=torch.full((K, ), 0.5)),
     'saves prior_marginals without prior_support'),
    (dict(prior_support=torch.full((K, ), 5.0),
          prior_marginals=torch.full((K, ), 7.0)),
     r'marginals \(class shares\) must lie in \[0, 1\], got 7'),
    (dict(prior_support=torch.full((K, ), -1.0),
          prior_marginals=torch.full((K, ), 0.5)), 'support must be >= 0'),
])
def test_a_bad_checkpoint_support_is_refused_naming_the_file(
        saved, extra, match):
    """A support without its marginals was dropped whole; marginals of 7
    failed at the first V' without naming the file."""
    cfg, _, state, meta, folder = saved
    path = str(folder / 'bad_support.pth')
    torch.save(dict(state_dict=dict(state, **extra), meta=meta), path)
    with pytest.raises(CheckpointError, match=match) as info:
        init_detector(cfg, path, device='cpu')
    assert path in str(info.value)


def test_set_prior_with_marginals_and_no_support_is_refused(saved):
    cfg = saved[0]
    model = init_detector(cfg, None, device='cpu')
    before = model.current_prior()
    with pytest.raises(ValueError, match='marginals without a support'):
        model.set_prior(random_prior(1, K), marginals=np.full(K, 0.5))
    with pytest.raises(ValueError, match='must lie in'):
        model.set_prior(
            random_prior(1, K), support=np.ones(K), marginals=np.full(K, 2))
    np.testing.assert_array_equal(model.get_prior(), before.matrix)
    np.testing.assert_array_equal(model.current_prior().support,
                                  before.support)


@pytest.mark.slow  # a tool run as a subprocess
def test_an_edited_prior_is_read_bare(tmp_path, run_tool):
    """edit_prior.py copied E_t's num_images / images_per_class: a
    support-aware model read a hand edit as measured on 117,266 images."""
    out = tmp_path / 'site.json'
    result = run_tool('tools/misc/edit_prior.py',
                      default_prior_path('coco2017_train'), '--set',
                      'person|bicycle=0.95', '--out', str(out))
    assert result.returncode == 0, result.stderr
    assert 'not kept: num_images, images_per_class' in result.stdout
    data = json.loads(out.read_text())
    assert not {'num_images', 'images_per_class'} & set(data)
    assert data['edits'] == ['person|bicycle=0.95']
    edited = Prior.load(str(out))
    assert not edited.has_support


def test_the_reweighting_reads_e_t_support_or_refuses_it(tmp_path):
    """class_frequencies clipped what it read: NaN num_images gave NaN
    logits (every re-weighting row at 2.63 AP), a count above num_images
    moved rows by 2-8 AP, support_images was ignored."""
    from mmcalidet.evaluation import class_frequencies
    classes = ['a', 'b', 'c']
    matrix = random_prior(0, 3)
    path = str(tmp_path / 'e_t.json')
    save_prior(path, matrix, classes, num_images=10,
               images_per_class=dict(a=5, b=1, c=0))
    freq = class_frequencies(Prior.load(path))
    np.testing.assert_allclose(freq, [0.5, 0.1, 1e-6])
    save_prior(path, matrix, classes, num_images=7, support_images=20,
               images_per_class=dict(a=5, b=1, c=20))
    freq = class_frequencies(Prior.load(path))
    np.testing.assert_allclose(freq, [0.25, 0.05, 1 - 1e-6])
    for total, match in (('NaN', 'positive number'),
                         ('3', 'exceeds num_images')):
        # written by hand: save_prior refuses a NaN key itself
        path_text = json.dumps(dict(classes=classes, matrix=matrix.tolist(),
                                    images_per_class=dict(a=5, b=1, c=0)))
        with open(path, 'w') as f:
            f.write(path_text[:-1] + f', "num_images": {total}}}')
        with pytest.raises(ValueError, match=match):
            Prior.load(path)
    with pytest.raises(ValueError, match='records no images_per_class'):
        class_frequencies(Prior(matrix, classes))


def test_a_model_built_outside_a_runner_trains_on_its_own_order():
    """mmdet's convention for a model without dataset classes: warn once,
    read the named prior in its own class order (the count matches)."""
    from mmdet.registry import MODELS

    from testing import demo_batch
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model = MODELS.build(cfg.model)
    model.init_weights()
    with pytest.warns(UserWarning, match='its own class order'):
        data = model.data_preprocessor(demo_batch([[1, 2], [3]]), True)
        losses = model.loss(data['inputs'], data['data_samples'])
    assert all(torch.isfinite(v).all() for v in losses.values()
               if torch.is_tensor(v))
    e_t = Prior.load('coco2017_train')
    np.testing.assert_allclose(model.get_prior(), e_t.matrix, atol=1e-6)


def test_the_names_of_a_real_mismatch_are_still_refused():
    from mmdet.registry import MODELS
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model = MODELS.build(cfg.model)
    names = [f'class {k}' for k in range(K)]
    with pytest.raises(ValueError, match='do not match'):
        model.dataset_meta = dict(classes=names)


def test_a_prior_read_in_its_own_order_refuses_another_order_later():
    """Once trained in the prior's own order (no classes given), dataset
    classes in another order would mean the model trained on a misread
    prior: refused, where the same order passes."""
    from mmdet.registry import MODELS

    from testing import demo_batch
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model = MODELS.build(cfg.model)
    model.init_weights()
    with pytest.warns(UserWarning, match='its own class order'):
        data = model.data_preprocessor(demo_batch([[1], [3]]), True)
        model.loss(data['inputs'], data['data_samples'])
    own = list(Prior.load('coco2017_train').classes)
    model.dataset_meta = dict(classes=own)  # the same order: fine
    shuffled = own[1:] + own[:1]
    with pytest.raises(ValueError, match='read in its own class order'):
        model.dataset_meta = dict(classes=shuffled)
    with pytest.raises(ValueError, match='do not match'):
        model.dataset_meta = dict(classes=[f'c{k}' for k in range(K)])
