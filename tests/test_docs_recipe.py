# Copyright (c) mmcalidet contributors. All rights reserved.
"""The CaliDet recipe of docs/user_guides/new_baseline.md, as a user copies
it into a config of their own (outside the repository), builds the model
the guide describes."""
import os.path as osp
import re

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from testing import PROJECT_ROOT

GUIDE = osp.join(PROJECT_ROOT, 'docs', 'user_guides', 'new_baseline.md')


def recipe() -> str:
    with open(GUIDE) as f:
        text = f.read()
    section = text.split('## The recipe', 1)[1]
    return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_the_guides_recipe_builds_a_calidino_that_starts_as_the_dino(tmp_path):
    path = tmp_path / 'calidet_dino_mine.py'
    path.write_text(recipe() +
                    '\nmodel.update(backbone=dict(init_cfg=None))\n')
    cfg = Config.fromfile(str(path))
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    assert type(model).__name__ == 'CaliDINO'
    head = model.bbox_head
    assert type(head).__name__ == 'CaliDINOHead'
    assert head.rho == 0.2 and head.loss_loma.loss_weight == 20.0
    sampler = model.data_preprocessor.batch_augments[0]
    assert type(sampler).__name__ == 'EdgeSampler'
    assert sampler.num_classes == 80
    assert sampler.dataset_prior is not None
    np.testing.assert_allclose(
        np.asarray(sampler.dataset_prior), model.get_prior(), atol=1e-6)
    # zero_init_output: V' is 0 for any prior, so the first step is the
    # baseline's
    assert len(head.califormer.encoder.layers) == 3
    v = head.get_cali_vectors(torch.from_numpy(model.get_prior()[None]))
    assert v.abs().max() == 0


def _classes_without_docstrings(source: str) -> dict:
    """The classes of a source, as ASTs without docstrings or ``pass``."""
    import ast
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in [node] + [
                    n for n in node.body if isinstance(n, ast.FunctionDef)
            ]:
                item.body = [
                    n for n in item.body
                    if not (isinstance(n, ast.Pass) or (
                        isinstance(n, ast.Expr)
                        and isinstance(getattr(n, 'value', None),
                                       ast.Constant)))
                ]
            out[node.name] = ast.dump(node)
    return out


def _section(title: str) -> str:
    with open(GUIDE) as f:
        return f.read().split(title, 1)[1].split('\n## ', 1)[0]


@pytest.mark.parametrize('title,files,config', [
    ('## Another DETR head', ('dense_heads/cali_dab_detr_head.py',
                              'detectors/cali_dab_detr.py'),
     'calidet_dab-detr_tiny_coco-mini.py'),
    ('## A one-stage head', ('dense_heads/cali_rtmdet_head.py',
                             'detectors/cali_rtmdet.py'),
     'calidet_rtmdet_tiny_8xb32-300e_coco.py'),
    ('## A two-stage head',
     ('roi_heads/cali_convfc_bbox_head.py',
      'roi_heads/cali_standard_roi_head.py', 'detectors/cali_faster_rcnn.py'),
     'calidet_faster-rcnn_r50_fpn_1x_coco.py'),
])
def test_the_worked_examples_are_the_repositorys_code(title, files, config):
    """The ports the guide shows (DAB-DETR, RTMDet, Faster R-CNN) are the
    code that tests/test_models/ builds and trains: the classes as written
    (docstrings aside), the config's lines in its file."""
    blocks = re.findall(r'```python\n(.*?)```', _section(title), re.S)
    assert len(blocks) == 3
    shown = {}
    for block in blocks[:2]:
        shown.update(_classes_without_docstrings(block))
    repo = {}
    for path in files:
        with open(osp.join(PROJECT_ROOT, 'mmcalidet', 'models', path)) as f:
            repo.update(_classes_without_docstrings(f.read()))
    assert set(shown) == set(repo)
    for name, tree in shown.items():
        assert tree == repo[name], name
    with open(osp.join(PROJECT_ROOT, 'configs', 'calidet', config)) as f:
        config_lines = [line.strip() for line in f]
    for line in blocks[2].splitlines():
        assert line.strip() in config_lines, line
