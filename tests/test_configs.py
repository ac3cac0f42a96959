# Copyright (c) mmcalidet contributors. All rights reserved.
"""The shipped configs: every training config builds its detector and
keeps its recipe's gradient clipping (mmdet's DINO and Deformable
DETR: max_norm 0.1, L2; RTMDet and Faster R-CNN: none): an override of
``optim_wrapper`` with ``_delete_`` or a new ``type`` would drop it, and
CaliDet's fine-tune starts with large CaliFormer gradients. The fragments of
``configs/_base_/`` are not training configs: each loads, defines only
named variables that no mmdet detector config defines (so it can sit
beside one as a sibling base) and is used."""
import copy
import functools
import glob
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from testing import PROJECT_ROOT, build_detector, get_config

CONFIG_ROOT = osp.join(PROJECT_ROOT, 'configs')
# the package's configs, the projects' and their experiments' (named
# relative to configs/)
CONFIGS = sorted(
    osp.relpath(path, CONFIG_ROOT)
    for path in glob.glob(osp.join(CONFIG_ROOT, '*', '*.py')) +
    glob.glob(osp.join(PROJECT_ROOT, 'projects', '*', 'configs', '*.py')) +
    glob.glob(
        osp.join(PROJECT_ROOT, 'projects', '*', 'experiments', '*',
                 'calidet_*.py'))
    if not path.startswith(osp.join(CONFIG_ROOT, '_base_', '')))
FRAGMENTS = sorted(
    osp.relpath(path, CONFIG_ROOT) for path in glob.glob(
        osp.join(CONFIG_ROOT, '_base_', '**', '*.py'), recursive=True))
# the mmdet configs the fragments sit beside
DETECTOR_BASES = ('dino/dino-4scale_r50_8xb2-12e_coco.py',
                  'deformable_detr/deformable-detr_r50_16xb2-50e_coco.py')


def test_every_config_is_found():
    assert len(CONFIGS) >= 10
    assert 'calidet/calidet_dino_tiny_coco-mini.py' in CONFIGS
    assert '../projects/context_shift/configs/' \
        'calidet_dino_tiny_context-shift.py' in CONFIGS
    assert '../projects/context_shift/experiments/site_simulation/' \
        'calidet_dino_tiny_context-shift_cached_site.py' in CONFIGS
    assert not any(name.startswith('_base_') for name in CONFIGS)
    assert {
        '_base_/calidet.py', '_base_/calidet_deformable-detr.py',
        '_base_/datasets/coco-mini.py', '_base_/schedules/tiny.py'
    } <= set(FRAGMENTS)


def _mmdet_keys():
    import mmdet
    root = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs')
    return {
        key
        for base in DETECTOR_BASES
        for key in Config.fromfile(osp.join(root, base)).keys()
    }


@pytest.mark.parametrize('name', FRAGMENTS)
def test_fragments_load_and_clash_with_no_detector_key(name):
    """A fragment is merged as a sibling of an mmdet detector config:
    mmengine refuses a key defined by two sibling bases."""
    fragment = Config.fromfile(osp.join(CONFIG_ROOT, name))
    assert len(fragment.keys()) > 0, name
    clash = set(fragment.keys()) & _mmdet_keys()
    assert not clash, f'{name} defines keys of mmdet configs: {clash}'
    assert 'model' not in fragment and 'train_dataloader' not in fragment
    # used by a config (a fragment nothing lists is dead text)
    text = ''.join(open(osp.join(CONFIG_ROOT, c)).read() for c in CONFIGS)
    assert f"'../{name}'" in text, f'no config lists {name}'


# the projects' own fragments (projects/<name>/configs/_base_/), listed by
# their project's configs as './_base_/<file>'
PROJECT_FRAGMENTS = sorted(
    glob.glob(osp.join(PROJECT_ROOT, 'projects', '*', 'configs', '_base_',
                       '*.py')))


@pytest.mark.parametrize(
    'path', PROJECT_FRAGMENTS,
    ids=[osp.relpath(p, PROJECT_ROOT) for p in PROJECT_FRAGMENTS])
def test_project_fragments_define_variables_only_and_are_used(path):
    fragment = Config.fromfile(path)
    assert len(fragment.keys()) > 0, path
    assert 'model' not in fragment and 'train_dataloader' not in fragment
    folder = osp.dirname(osp.dirname(path))
    text = ''.join(
        open(c).read() for c in glob.glob(osp.join(folder, '*.py')))
    assert f"'./_base_/{osp.basename(path)}'" in text, \
        f'no config of {folder} lists {osp.basename(path)}'


def test_the_support_prior_is_the_same_recipe_for_both_variants():
    """The 10- and 40-class support-aware configs differ from their
    variant's default only by the fragment's options."""
    root = 'projects/context_shift/configs/'
    for variant in ('', '_many-class'):
        base = get_config(
            f'../{root}calidet_dino_tiny_context-shift{variant}_cached.py')
        cfg = get_config(f'../{root}calidet_dino_tiny_context-shift'
                         f'{variant}_cached_support.py')
        sampler = cfg.model.data_preprocessor.batch_augments[0]
        assert sampler.support is True and sampler.site_support == (1, 256)
        assert sampler.mode_probs.sim_site == 1.0
        former = cfg.model.bbox_head.califormer
        assert former.support_features and former.lift_bias
        for key in ('num_layers', 'num_heads', 'feedforward_channels'):
            assert former[key] == base.model.bbox_head.califormer[key]
        assert cfg.model.bbox_head.num_classes == \
            base.model.bbox_head.num_classes
        assert cfg.train_dataloader == base.train_dataloader


@functools.lru_cache(maxsize=None)
def _read(name):
    """``configs/<name>`` parsed once for the tests that only read it."""
    return get_config(name)


def _prior_for(cfg, tmp_path):
    """The config's own prior where it ships (COCO), else (the generated
    context-shift data) a valid K x K prior file with its class names."""
    from mmcalidet.priors import batch_prior, save_prior
    if cfg.get('prior') == 'coco2017_train':
        return None
    classes = cfg.metainfo['classes']
    return save_prior(
        str(tmp_path / 'E_t.json'),
        batch_prior(len(classes), [np.arange(len(classes))]),
        classes=classes)


def _head_cfg(model_cfg):
    """The config of the head that holds the classes (and the CaliFormer):
    the ``bbox_head``, a two-stage detector's ``roi_head.bbox_head``."""
    if 'bbox_head' in model_cfg:
        return model_cfg.bbox_head
    return model_cfg.get('roi_head', {}).get('bbox_head', {})


# a ResNet-50 detector takes seconds to build: those run with the slow tests
@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.slow) if '_r50_' in name else name
    for name in CONFIGS
])
def test_every_config_builds_its_detector(name, tmp_path):
    from mmdet.registry import MODELS
    cfg = copy.deepcopy(_read(name))  # parsed once for both tests
    if 'prior' in cfg.model:
        prior = _prior_for(cfg, tmp_path)
        if prior is not None:
            cfg.model.prior = prior  # the EdgeSampler takes the detector's
    model = MODELS.build(cfg.model)  # no init_weights: nothing downloaded
    head_cfg = _head_cfg(cfg.model)
    num_classes = head_cfg.num_classes
    head = getattr(model, 'calibrated_head', None)
    if head is None:  # a plain detector: a two-stage one's box head
        head = model.bbox_head if hasattr(model, 'bbox_head') else \
            model.roi_head.bbox_head
    assert head.num_classes == num_classes, name
    if 'prior' in cfg.model:
        califormer = head.califormer
        assert califormer.nodes.shape[0] == num_classes, name
        assert len(califormer.encoder.layers) == \
            head_cfg.califormer.num_layers, name
        sampler, = model.data_preprocessor.batch_augments
        assert sampler.num_classes == num_classes, name


@pytest.mark.parametrize('name', CONFIGS)
def test_training_configs_clip_gradients(name):
    """As their detector's mmdet recipe: the DETRs at 0.1, FCOS at 35,
    RTMDet and Faster R-CNN not (the tiny DINOs clip inside the fused
    AdamW's step: FusedClipOptimWrapper, the same update)."""
    cfg = _read(name)
    assert 'train_cfg' in cfg, f'{name} is not a training config'
    wrapper = cfg.optim_wrapper
    assert wrapper.get('type', 'OptimWrapper') in (
        'OptimWrapper', 'FusedClipOptimWrapper'), name
    unclipped = 'rtmdet' in name or 'faster-rcnn' in name
    expected = None if unclipped else dict(
        max_norm=35 if 'fcos' in name else 0.1, norm_type=2)
    assert wrapper.get('clip_grad') == expected, name


def test_the_built_optimizer_clips():
    name = 'calidet/calidet_dino_tiny_coco-mini.py'
    model = build_detector(name)
    wrapper = build_optim_wrapper(model, get_config(name).optim_wrapper)
    assert wrapper.clip_grad_kwargs == dict(max_norm=0.1, norm_type=2)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    wrapper.step()  # clips, then steps
    norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
    assert float(norm) == pytest.approx(0.1, rel=1e-3)


def test_calidet_configs_that_load_a_baseline_start_as_it():
    # V' = 0 at the start (zero_init_output) wherever a trained baseline
    # is loaded: the first step is then the baseline's (model.md)
    loading = []
    for name in CONFIGS:
        cfg = _read(name)
        califormer = _head_cfg(cfg.model).get('califormer')
        if califormer is not None and cfg.get('load_from'):
            loading.append(name)
            assert califormer.get('zero_init_output') is True, name
    # the rule was checked on every calibrator and fine-tune config
    assert {
        'calidet/calidet_dino_tiny_coco-mini_cached.py',
        'calidet/calidet_dino-4scale_r50_8xb2-6e_coco.py',
        '../projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift_cached.py',
        '../projects/context_shift/configs/'
        'calidet_dino_tiny_context-shift.py',
    } <= set(loading), loading
