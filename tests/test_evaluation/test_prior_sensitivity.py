# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet.evaluation.sensitivity and tools/analysis_tools/
prior_sensitivity.py."""
import json
import os.path as osp
import runpy

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import save_checkpoint
from torch import nn

from mmcalidet.apis import init_detector
from mmcalidet.evaluation.sensitivity import prior_sensitivity
from mmcalidet.models import CaliFormer
from mmcalidet.models.dense_heads.calibrated_cls import CalibratedClsMixin
from mmcalidet.priors import flat_prior, flip_prior, sample_prior
from testing import PROJECT_ROOT, get_config, run_tool_in_process

K, D = 6, 16
TOOL = osp.join(PROJECT_ROOT, 'tools', 'analysis_tools',
                'prior_sensitivity.py')


class Head(nn.Module):
    """The parts of a calibrated head the probe reads: a two-stage head
    with one decoder layer (``cls_branches[0]``) and the encoder's proposal
    classifier (``cls_branches[1]``)."""

    as_two_stage = True
    head_kind = 'decoder'
    num_classes = K
    decoder_cls_branch = CalibratedClsMixin.decoder_cls_branch
    decoder_cls_branches = CalibratedClsMixin.decoder_cls_branches

    def __init__(self, rho=0.2, mode='plain'):
        super().__init__()
        # 'plain': V' = g(E); 'ignore': V' = g(E0) for every prior (a head
        # that ignores it); 'relative': V' = g(E) - g(E0) (0 at E0)
        self.mode = mode
        torch.manual_seed(0)
        self.califormer = CaliFormer(
            num_classes=K,
            embed_dims=D,
            num_layers=2,
            num_heads=2,
            feedforward_channels=32)
        self.califormer.init_weights()
        with torch.no_grad():
            self.califormer.nodes.normal_()
        self.califormer.eval()
        self.cls_branches = nn.ModuleList([nn.Linear(D, K), nn.Linear(D, K)])
        self.rho = rho

    def get_cali_vectors(self, priors):
        flat = torch.full((K, K), 0.5).fill_diagonal_(1.0).to(priors)
        if self.mode == 'ignore':
            return self.califormer(flat).expand(*priors.shape[:-1], D)
        if self.mode == 'relative':
            return self.califormer(priors) - self.califormer(flat)
        return self.califormer(priors)


LABELS = [[0, 2], [1, 3, 4], [5, 0, 1]]


def test_rows_match_a_hand_computation():
    head = Head()
    e_t = np.random.default_rng(0).uniform(size=(K, K))
    np.fill_diagonal(e_t, 1.0)
    rows = {r['prior']: r for r in prior_sensitivity(head, LABELS + [[]], e_t)}
    assert list(rows) == ['E_x', 'flip_E_x', 'E_t']
    assert rows['E_x']['num_priors'] == 3  # the empty label set is skipped
    w = head.cls_branches[0].weight.detach()  # not the encoder's [1]
    unit = w / w.norm(dim=1, keepdim=True)
    with torch.no_grad():
        v0 = head.califormer(torch.tensor(flat_prior(K)).float())
        for kind, make in (('E_x', lambda lab: sample_prior(K, lab)),
                           ('flip_E_x',
                            lambda lab: flip_prior(sample_prior(K, lab)))):
            present, absent, change = [], [], []
            for labels in LABELS:
                v = head.califormer(torch.tensor(make(labels)).float())
                shift = 0.2 * ((v - v0) * unit).sum(-1)
                mask = np.isin(np.arange(K), labels)
                present += shift[mask].tolist()
                absent += shift[~mask].tolist()
                change.append((v - v0).norm(dim=-1).mean())
            row = rows[kind]
            assert row['present_shift'] == pytest.approx(
                np.mean(present), abs=1e-6)
            assert row['absent_shift'] == pytest.approx(
                np.mean(absent), abs=1e-6)
            assert row['relative_change'] == pytest.approx(
                float(torch.stack(change).mean() / v0.norm(dim=-1).mean()),
                rel=1e-5)
    assert rows['E_x']['relative_change'] > 0
    assert rows['E_x']['present_shift'] != rows['flip_E_x']['present_shift']
    assert np.isnan(rows['E_t']['absent_shift'])  # every class "present"


def test_w_is_the_last_decoder_layers_classifier_of_a_real_head():
    """DINO's head appends the encoder's proposal classifier to
    cls_branches: the probe's W is the last decoder layer's."""
    init_default_scope('mmdet')
    torch.manual_seed(0)
    head = MODELS.build(
        get_config('calidet/calidet_dino_tiny_coco-mini.py').model).bbox_head
    head.init_weights()
    assert head.as_two_stage and len(head.cls_branches) == 3  # 2 + encoder
    assert head.decoder_cls_branch(-1) is head.cls_branches[1]
    assert head.decoder_cls_branch(0) is head.cls_branches[0]
    with pytest.raises(IndexError):
        head.decoder_cls_branch(2)
    with torch.no_grad():  # make the encoder's branch the odd one out
        head.cls_branches[2].weight.mul_(-1)
    rows = prior_sensitivity(head, [[0, 1]])
    w = head.cls_branches[1].weight
    unit = w / w.norm(dim=1, keepdim=True)
    with torch.no_grad():
        v0 = head.get_cali_vectors(torch.tensor(flat_prior(80)).float())
        v = head.get_cali_vectors(
            torch.tensor(sample_prior(80, [0, 1])).float())
        shift = head.rho * ((v - v0) * unit).sum(-1)
    assert rows[0]['present_shift'] == pytest.approx(
        float(shift[[0, 1]].mean()), abs=1e-7)


def test_a_head_that_ignores_the_prior_reads_zero():
    rows = prior_sensitivity(Head(mode='ignore'), LABELS)
    assert [r['prior'] for r in rows] == ['E_x', 'flip_E_x']
    for r in rows:
        assert r['relative_change'] == pytest.approx(0, abs=1e-6)
        assert r['present_shift'] == pytest.approx(0, abs=1e-7)


def test_a_head_zero_at_e0_has_shifts_and_no_relative_change():
    # V'(E0) = 0 by construction: the relative change has no scale (NaN,
    # not a division by ~0), the logit shifts are the plain head's
    plain = {r['prior']: r for r in prior_sensitivity(Head(), LABELS)}
    rows = prior_sensitivity(Head(mode='relative'), LABELS)
    for r in rows:
        assert np.isnan(r['relative_change'])
        assert r['present_shift'] == pytest.approx(
            plain[r['prior']]['present_shift'], abs=1e-6)
        assert r['absent_shift'] == pytest.approx(
            plain[r['prior']]['absent_shift'], abs=1e-6)
    assert rows[0]['present_shift'] != 0


CALI = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
DINO = 'configs/calidet/dino_tiny_coco-mini.py'


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    init_default_scope('mmdet')
    out = tmp_path_factory.mktemp('sens')
    paths = []
    for config in (CALI, DINO):
        torch.manual_seed(0)
        model = MODELS.build(get_config(config.split('configs/')[1]).model)
        model.init_weights()
        path = str(out / (osp.basename(config) + '.pth'))
        save_checkpoint(dict(state_dict=model.state_dict()), path)
        paths.append(path)
    return paths


@pytest.mark.slow
def test_tool_prints_the_table_and_writes_json(checkpoints, tmp_path,
                                               monkeypatch, capsys):
    monkeypatch.chdir(PROJECT_ROOT)
    main = runpy.run_path(TOOL, run_name='tool')['main']
    out = str(tmp_path / 'sens.json')
    assert main([CALI, checkpoints[0], '--num-images', '5', '--out', out]) == 0
    table = capsys.readouterr().out
    for kind in ('E_x', 'flip_E_x', 'E_t'):
        assert f'| {kind} |' in table
    with open(out) as f:
        rows = json.load(f)
    assert [r['num_priors'] for r in rows] == [5, 5, 1]


@pytest.mark.slow
def test_tool_errors_name_the_problem(checkpoints, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    res = run_tool_in_process(TOOL, DINO, checkpoints[1])
    assert res.returncode == 1
    assert 'not a calibratable detector' in res.stderr
    main = runpy.run_path(TOOL, run_name='tool')['main']
    with pytest.raises(ValueError, match='--objects'):
        main([CALI, checkpoints[0], '--objects', '3', '2'])


@pytest.mark.slow
def test_tool_probes_the_label_sets_of_real_images(checkpoints, tmp_path,
                                                   monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    model = init_detector(CALI, checkpoints[0], device='cpu')
    names = list(model.dataset_meta['classes'])
    # categories in another id order than the model's classes: matched by
    # name; the image without an object is left out
    cats = [dict(id=100 - k, name=n) for k, n in enumerate(names)]
    ann = dict(
        images=[
            dict(id=i, file_name=f'{i}.jpg', width=8, height=8)
            for i in (1, 2, 3)
        ],
        annotations=[
            dict(
                id=n,
                image_id=img,
                category_id=cat,
                bbox=[0, 0, 2, 2],
                area=4,
                iscrowd=0)
            for n, (img, cat) in enumerate([(1, 100), (1, 99), (2, 90)], 1)
        ],
        categories=cats)
    path = str(tmp_path / 'val.json')
    with open(path, 'w') as f:
        json.dump(ann, f)
    main = runpy.run_path(TOOL, run_name='tool')['main']
    out = str(tmp_path / 'sens.json')
    assert main([CALI, checkpoints[0], '--labels', path, '--out', out]) == 0
    with open(out) as f:
        rows = {r['prior']: r for r in json.load(f)}
    assert [rows[k]['num_priors'] for k in ('E_x', 'flip_E_x', 'E_t')] == \
        [2, 2, 1]
    # the same rows as the library on the two images' classes, by name
    expected = prior_sensitivity(
        model.bbox_head, [np.array([0, 1]), np.array([10])], model.get_prior())
    for r in expected:
        assert rows[r['prior']]['present_shift'] == pytest.approx(
            r['present_shift'], abs=1e-6)
        assert rows[r['prior']]['absent_shift'] == pytest.approx(
            r['absent_shift'], abs=1e-6, nan_ok=True)
    # an annotation file without one of the model's classes names it
    ann['categories'] = cats[1:]
    ann['annotations'] = ann['annotations'][1:]
    with open(path, 'w') as f:
        json.dump(ann, f)
    with pytest.raises(ValueError, match="'person' is not a category"):
        main([CALI, checkpoints[0], '--labels', path])
