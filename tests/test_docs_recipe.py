# Copyright (c) mmcalidet contributors. All rights reserved.
"""The CaliDet recipe of docs/user_guides/new_baseline.md, as a user copies
it into a config of their own (outside the repository), builds the model
the guide describes."""
import os.path as osp
import re

import numpy as np
import torch
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmcalidet.testing import PROJECT_ROOT

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
