# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmdet's DINO test (tests/test_models/test_detectors/test_dino.py) on
CaliDINO, built by ``MODELS.build`` from the tiny config and from the
paper's (DINO-4scale, ResNet-50): the losses without and with a ground
truth box, then ``_forward`` and ``predict``. Also the named prior's
warnings (once from the EdgeSampler, once from the model) and the refusal
of class names that are not the prior's."""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

TINY = 'calidet_dino_tiny_coco-mini.py'
PAPER = 'calidet_dino-4scale_r50_8xb2-6e_coco.py'


@pytest.fixture(scope='module')
def tiny_config(model_config):
    return model_config(TINY)


@pytest.mark.parametrize('name', [
    pytest.param(TINY, id='tiny'),
    pytest.param(PAPER, id='paper', marks=pytest.mark.slow)
])
def test_losses_forward_and_predict(name, model_config, detr_body):
    torch.manual_seed(0)
    model = MODELS.build(model_config(name))
    model.init_weights()
    assert type(model).__name__ == 'CaliDINO'
    if name == PAPER:
        assert model.backbone.depth == 50
        assert (model.num_queries, model.decoder.num_layers) == (900, 6)
    detr_body(model)


def test_named_prior_warns_once_and_trains(tiny_config, edge_sampler_draws):
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(tiny_config))
    model.init_weights()  # level_embed is uninitialised memory until then
    losses = edge_sampler_draws(model,
                                demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]))
    assert losses['loss_loma'].item() != 0  # signed: linear in the logits
    assert all(torch.isfinite(loss) for loss in losses.values())


def test_other_class_names_are_refused(tiny_config, class_order, message_hub):
    class_order(tiny_config, demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]),
                message_hub)
