# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmdet's DAB-DETR test (tests/test_models/test_detectors/
test_dab_detr.py) on CaliDABDETR, built by ``MODELS.build`` from the tiny
config (there is no paper config of it): the losses without and with a
ground truth box, then ``_forward`` and ``predict``. Also the named
prior's warnings (once from the EdgeSampler, once from the model) and the
refusal of class names that are not the prior's."""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.testing import demo_mm_inputs

TINY = 'calidet_dab-detr_tiny_coco-mini.py'


@pytest.fixture(scope='module')
def tiny_config(model_config):
    return model_config(TINY)


def test_losses_forward_and_predict(tiny_config, detr_body):
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(tiny_config))
    model.init_weights()
    assert type(model).__name__ == 'CaliDABDETR'
    detr_body(model)


def test_named_prior_warns_once_and_trains(tiny_config, edge_sampler_draws):
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(tiny_config))
    model.init_weights()  # as mmdet's test: some weights are set only here
    losses = edge_sampler_draws(model,
                                demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]))
    assert losses['loss_loma'].item() != 0  # signed: linear in the logits
    assert all(torch.isfinite(loss) for loss in losses.values())


def test_other_class_names_are_refused(tiny_config, class_order, message_hub):
    class_order(tiny_config, demo_mm_inputs(2, [[3, 64, 64], [3, 64, 64]]),
                message_hub)
