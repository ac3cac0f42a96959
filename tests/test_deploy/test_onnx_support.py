# Copyright (c) mmcalidet contributors. All rights reserved.
"""ONNX export of a support-aware CaliFormer (experimental): the prior's
support and class shares are graph inputs beside the prior, fed from the
prior file's record at run time (zeros: no support), and ONNX Runtime
agrees with PyTorch under priors with and without a support."""
import os.path as osp

import numpy as np
import onnx
import pytest
import torch
from mmdet.datasets import CocoDataset

from mmcalidet.deploy import OnnxDetector, export_onnx, verify_onnx
from mmcalidet.priors import save_prior
from testing import build_detector, data_root, random_prior

# exports a detector and runs ONNX Runtime: the slow tier
pytestmark = pytest.mark.slow

K = 80
SHAPE = (128, 128)
CLASSES = list(CocoDataset.METAINFO['classes'])
IMAGE = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                 '000000005001.jpg')


def site_prior_file(path: str) -> str:
    """A prior file recording its support: 32 images, class c in c % 9 of
    them."""
    save_prior(
        path,
        random_prior(7, K),
        CLASSES,
        num_images=32,
        images_per_class={
            c: i % 9
            for i, c in enumerate(CLASSES)
        })
    return path


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """(model, onnx file, a prior file recording its support)."""
    from testing import get_config
    cfg = get_config('calidet/calidet_dino_tiny_coco-mini.py')
    model = build_detector(
        'calidet/calidet_dino_tiny_coco-mini.py',
        seed=0,
        bbox_head=dict(
            cfg.model.bbox_head,
            califormer=dict(
                cfg.model.bbox_head.califormer,
                support_features=True,
                lift_bias=True,
                zero_init_output=False))).eval()
    former = model.bbox_head.califormer
    with torch.no_grad():  # the zero-initialised branches, made to matter
        former.support_proj.weight.normal_(std=1.0)
        former.lift_scale.fill_(2.0)
    folder = tmp_path_factory.mktemp('onnx_support')
    site = site_prior_file(str(folder / 'site.json'))
    out = str(folder / 'support.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    return model, out, site


def test_the_graph_takes_the_support_beside_the_prior(exported):
    model, out, _ = exported
    inputs = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in onnx.load(out).graph.input
    }
    assert inputs == dict(
        input=[1, 3, *SHAPE],
        prior=[K, K],
        prior_support=[K],
        prior_marginals=[K])
    detector = OnnxDetector(out)
    assert detector.support_input
    # the exported deployment prior is E_t with its file's support
    np.testing.assert_allclose(detector.default_support[0],
                               model.prior_support.numpy())


def test_onnx_runtime_agrees_with_pytorch_with_and_without_support(exported):
    model, out, site = exported
    # E_t with its support, a prior file with its own, a bare matrix (none)
    report = verify_onnx(
        out, model, [IMAGE], [None, site, random_prior(7, K)], atol=1e-4)
    assert report['ok'], report['failures']
    detector = OnnxDetector(out)
    n, share = detector.resolve_support(site)
    assert n.tolist() == [32.0] * K and share[1] == pytest.approx(1 / 32)
    array, _, _ = detector.preprocess(IMAGE)
    from_file = detector.run_input(array, site)[0]
    bare = detector.run_input(array, detector.resolve_prior(site))[0]
    assert not np.allclose(from_file[:, 4], bare[:, 4]), \
        'the support input reaches the scores'


def test_a_bad_support_is_refused_before_onnx_runtime_runs(exported):
    _, out, site = exported
    detector = OnnxDetector(out)
    array, _, _ = detector.preprocess(IMAGE)
    with pytest.raises(ValueError, match='support must have shape'):
        detector.run_input(array, site, (np.ones(K - 1), np.zeros(K)))
    with pytest.raises(ValueError, match='class shares must lie in'):
        detector.run_input(array, site, (np.ones(K), np.full(K, 2.0)))


def support_aware(config: str, head_path: str, perturb) -> torch.nn.Module:
    """A tiny one- or two-stage CaliDet whose CaliFormer reads the support
    (its branches not zero), with scores a prior visibly moves."""
    from testing import get_config
    cfg = get_config(config)
    head_cfg = cfg.model
    for key in head_path.split('.'):
        head_cfg = head_cfg[key]
    head_cfg.califormer.update(
        support_features=True, lift_bias=True, zero_init_output=False)
    model = build_detector(
        config,
        seed=0,
        **{
            head_path.split('.')[0]: cfg.model[head_path.split('.')[0]]
        }).eval()
    head = model.calibrated_head
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        head.califormer.support_proj.weight.normal_(std=1.0, generator=gen)
        head.califormer.lift_scale.fill_(2.0)
        perturb(head, gen)
    head.rho = 5.0
    model._cali_cache = None
    return model


def _two_stage(head, gen):
    for p in (head.fc_cls.weight, head.fc_reg.weight):
        p.add_(torch.randn(p.shape, generator=gen) * 0.01)


def _one_stage(head, gen):
    for p in head.rtm_cls.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    for conv in head.rtm_cls:  # few candidates, as a trained head
        conv.bias.fill_(-6.0)


@pytest.mark.parametrize('config, head_path, perturb', [
    ('calidet/calidet_faster-rcnn_tiny_coco-mini.py', 'roi_head.bbox_head',
     _two_stage),
    ('calidet/calidet_rtmdet_tiny_coco-mini.py', 'bbox_head', _one_stage),
])
def test_one_and_two_stage_graphs_take_the_support(config, head_path, perturb,
                                                   tmp_path):
    model = support_aware(config, head_path, perturb)
    out = str(tmp_path / 'support.onnx')
    export_onnx(model, out, SHAPE, prior_input=True)
    assert [i.name for i in onnx.load(out).graph.input
            ] == ['input', 'prior', 'prior_support', 'prior_marginals']
    site = site_prior_file(str(tmp_path / 'site.json'))
    report = verify_onnx(out, model, [IMAGE], [None, site, random_prior(7, K)])
    assert report['ok'], report['failures']
    detector = OnnxDetector(out)
    array = detector.preprocess(IMAGE)[0]
    from_file = detector.run_input(array, site)[0]
    bare = detector.run_input(array, detector.resolve_prior(site))[0]
    assert len(from_file) and len(bare)
    assert not np.allclose(np.sort(from_file[:, 4])[-5:],
                           np.sort(bare[:, 4])[-5:]), \
        'the support input reaches the scores'


@pytest.mark.parametrize('config, head_path, perturb, detections_move', [
    ('calidet/calidet_faster-rcnn_tiny_coco-mini.py', 'roi_head.bbox_head',
     _two_stage, True),
    ('calidet/calidet_rtmdet_tiny_coco-mini.py', 'bbox_head', _one_stage,
     False),
])
def test_a_folded_prior_is_set_prior_of_its_file(config, head_path, perturb,
                                                 detections_move, tmp_path):
    """``--fold-prior site.json`` folds V' of the file's prior with its
    support: the folded model and its graph give what ``set_prior`` of the
    file gives, in PyTorch and in ONNX Runtime (a fold without the support
    scored 0.036 where set_prior scored 0.016)."""
    import copy

    from mmcalidet.deploy import fold_prior
    from mmcalidet.deploy.export import export_wrapper
    model = support_aware(config, head_path, perturb)
    site = site_prior_file(str(tmp_path / 'site.json'))
    folded = fold_prior(model, site)
    reference = copy.deepcopy(model)
    reference.set_prior(site)
    assert reference.prior_support is not None
    bare = copy.deepcopy(model)
    bare.set_prior(model.resolve(site).without_support())
    gen = torch.Generator().manual_seed(0)
    tensor = torch.rand(1, 3, *SHAPE, generator=gen)
    with torch.no_grad():
        # every location's (RoI's) boxes and class scores, before the NMS
        folded_out, reference_out, bare_out = [
            export_wrapper(m, SHAPE, prior_input=False,
                           support_input=False)(tensor)
            for m in (folded, reference, bare)
        ]
    # (the one-stage head's scores sit low on the sigmoid: small numbers)
    diff = max(float((a - b).abs().max())
               for a, b in zip(folded_out, reference_out))
    without = max(float((a - b).abs().max())
                  for a, b in zip(folded_out, bare_out))
    assert diff < 1e-6 and without > 100 * max(diff, 1e-9), \
        'the folded model is set_prior of the file, support included'
    out = str(tmp_path / 'folded.onnx')
    export_onnx(folded, out, SHAPE, prior_input=False)
    # the graph against the model under the file's prior, not the fold
    report = verify_onnx(out, reference, [IMAGE], [None], atol=1e-4)
    assert report['ok'], report['failures']
    detector = OnnxDetector(out)
    assert detector.meta['folded'] and detector.default_support is not None
    if detections_move:
        report = verify_onnx(out, bare, [IMAGE], [None], atol=1e-4)
        assert not report['ok'], \
            'verify sees a fold that dropped the support'


def test_the_runtime_refuses_a_bad_support_pair_or_image(exported):
    """One line, not a traceback: a one-element support tuple, an empty
    image, an image file that is not an image."""
    _, out, site = exported
    detector = OnnxDetector(out)
    array = detector.preprocess(IMAGE)[0]
    with pytest.raises(ValueError, match='must be a pair'):
        detector.run_input(array, site, (np.ones(K), ))
    with pytest.raises(ValueError, match='must not be empty'):
        detector(np.zeros((0, 5, 3), np.uint8), prior=site)
