# Copyright (c) mmcalidet contributors. All rights reserved.
"""The parity tier: the steps and assertions of mmdet 3.3's own detector
tests (its tests/test_models/test_detectors/: test_dino.py,
test_deformable_detr.py, test_dab_detr.py, test_single_stage.py and
test_two_stage.py), written anew and run on the CPU against every Cali
detector, each built by ``MODELS.build`` from our configs
(configs/calidet/) outside any mmengine Runner, as mmdet's tests build
theirs.

A model built that way has no dataset classes: its named prior
('coco2017_train', a file that names its classes) is read in its own class
order, with one UserWarning from the model and one from its EdgeSampler;
a dataset whose class names are not the prior's is still refused. The
fixtures here give each file the shared parts: the config's model, a
message hub of its own, the DETR bodies, the warning checks and the class
order checks.
"""
import contextlib
import copy
import os
import os.path as osp
import time
import uuid
import warnings

import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.structures import InstanceData

import mmcalidet  # noqa: F401  (registers the Cali detectors)
from testing import PROJECT_ROOT, data_root

register_all_modules()

#: the warnings of a named prior read without dataset classes
MODEL_OWN_ORDER = r'\(model\.prior\) names its classes.*own class order'
SAMPLER_OWN_ORDER = r'^EdgeSampler: .*in its own class order'
#: COCO's classes, in mmdet's order (the shipped prior's are the same)
COCO_CLASSES = list(CocoDataset.METAINFO['classes'])


def load_model_config(name: str):
    """``cfg.model`` of ``configs/calidet/<name>`` (by
    ``Config.fromfile``, which imports the config's ``custom_imports``),
    with ``backbone.init_cfg = None``: nothing pretrained is fetched."""
    os.environ.setdefault('MMCALIDET_DATA', data_root())
    cfg = Config.fromfile(osp.join(PROJECT_ROOT, 'configs', 'calidet', name))
    model = copy.deepcopy(cfg.model)
    model.backbone.init_cfg = None
    return model


@pytest.fixture(scope='session')
def model_config():
    """``model_config(name)``: the model part of a calidet config, as
    mmdet's ``get_detector_cfg`` gives it, without pretrained weights."""
    return load_model_config


@pytest.fixture
def message_hub():
    """A message hub of this test's own, current while it runs (iter and
    epoch 0, as mmdet's single-stage loss test sets them); the one before
    is current again afterwards."""
    name = f'test_parity-{time.time()}-{uuid.uuid4().hex}'
    hub = MessageHub.get_instance(name)
    hub.update_info('iter', 0)
    hub.update_info('epoch', 0)
    yield hub
    MessageHub._instance_dict.pop(name, None)


@contextlib.contextmanager
def no_own_order_warning():
    """Fail if the block warns again that a prior is read in its own class
    order (the warnings come once per model and sampler)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        yield
    again = [
        str(w.message) for w in caught
        if 'in its own class order' in str(w.message)
    ]
    assert not again, again


def detr_sample(size: int) -> DetDataSample:
    """The data sample of mmdet's DETR tests: one ``size`` x ``size``
    image, no padding."""
    sample = DetDataSample()
    sample.set_metainfo(
        dict(
            img_shape=(size, size),
            scale_factor=(1, 1),
            pad_shape=(size, size),
            batch_input_shape=(size, size)))
    return sample


def check_detr_body(model) -> None:
    """mmdet's DETR test body (DINO, Deformable DETR, DAB-DETR) on a built
    and initialised model in training mode, with one 256 x 256 random
    image: the losses without ground truth (classification > 0; box, IoU
    and denoising 0) and with one box (all > 0), then ``_forward`` (every
    decoder layer's K class scores and box per query) and
    ``predict(rescale=True)`` in eval mode. The first loss must warn, once,
    that the named prior is read in its own class order."""
    size = 256
    torch.manual_seed(0)
    image = torch.rand(1, 3, size, size)
    sample = detr_sample(size)
    sample.gt_instances = InstanceData(
        bboxes=torch.empty((0, 4)), labels=torch.LongTensor([]))
    with pytest.warns(UserWarning, match=MODEL_OWN_ORDER):
        empty = model.loss(image, batch_data_samples=[sample])
    assert 'loss_loma' in empty, sorted(empty)  # a Cali head's losses
    for key, loss in empty.items():
        value = loss.item()
        if 'bbox' in key or 'iou' in key or 'dn' in key:
            assert value == 0, f'{key} = {value} without ground truth'
        elif 'cls' in key:
            assert value > 0, f'{key} = {value} without ground truth'

    sample.gt_instances = InstanceData(
        bboxes=torch.Tensor([[23.6667, 23.8757, 238.6326, 151.8874]]),
        labels=torch.LongTensor([2]))
    with no_own_order_warning():
        one = model.loss(image, batch_data_samples=[sample])
    # LoMa is linear in the logits, so of either sign; the initialised
    # classifiers' logits are negative and make it positive here
    for key, loss in one.items():
        assert loss.item() > 0, f'{key} = {loss.item()} with one box'

    model.eval()
    with torch.no_grad():
        scores, boxes = model._forward(image, batch_data_samples=[sample])
        results = model.predict(
            image, batch_data_samples=[sample], rescale=True)
    layers, queries = model.decoder.num_layers, model.num_queries
    assert scores.shape == (layers, 1, queries, model.num_classes)
    assert boxes.shape == (layers, 1, queries, 4)
    assert len(results) == 1 and isinstance(results[0], DetDataSample)
    assert len(results[0].pred_instances) == model.test_cfg['max_per_img']


@pytest.fixture(scope='session')
def detr_body():
    """:func:`check_detr_body`."""
    return check_detr_body


def check_edge_sampler_draws(model, inputs: dict) -> dict:
    """An initialised model's data preprocessor in training mode warns
    that its EdgeSampler reads the named prior in its own class order, and
    gives every data sample a drawn K x K prior in [0, 1] with a unit
    diagonal (of one of the sampler's modes); the model's first loss on
    them warns too, and trains; neither warns again.

    Returns:
        dict: the losses.
    """
    k = model.num_classes
    (_, sampler), = model.edge_samplers()
    with pytest.warns(UserWarning, match=SAMPLER_OWN_ORDER):
        data = model.data_preprocessor(copy.deepcopy(inputs), True)
    for sample in data['data_samples']:
        prior = sample.prior
        assert prior.shape == (k, k)
        assert 0 <= prior.min() and prior.max() <= 1
        torch.testing.assert_close(torch.diagonal(prior), torch.ones(k))
        assert sample.metainfo['prior_mode'] in sampler.modes
    with pytest.warns(UserWarning, match=MODEL_OWN_ORDER):
        losses = model.forward(**data, mode='loss')
    with no_own_order_warning():
        model.data_preprocessor(copy.deepcopy(inputs), True)
        model.check_classes_matched()  # what the next loss checks first
    return losses


@pytest.fixture(scope='session')
def edge_sampler_draws():
    """:func:`check_edge_sampler_draws`."""
    return check_edge_sampler_draws


def check_class_order(model_cfg, inputs: dict, hub: MessageHub) -> None:
    """A named prior that meets dataset classes: class names that are not
    the prior's (the right count) are refused and change nothing, COCO's
    own classes in another order reorder it; a training loop's dataset of
    other names is refused by the EdgeSampler and by ``loss``.

    Args:
        model_cfg: the model's config (each check builds its own model).
        inputs (dict): a batch for the data preprocessor.
        hub (MessageHub): the current message hub (this test's own).
    """
    k = len(COCO_CLASSES)
    others = [f'not_{name}' for name in COCO_CLASSES]

    model = MODELS.build(copy.deepcopy(model_cfg))
    assert model.num_classes == k
    before = model.get_prior()
    with pytest.raises(ValueError, match='do not match'):
        model.dataset_meta = dict(classes=others)
    assert (model.get_prior() == before).all()
    # nothing was matched: the right classes, shuffled, still reorder it
    order = np.random.default_rng(0).permutation(k)
    model.dataset_meta = dict(classes=[COCO_CLASSES[i] for i in order])
    assert (model.get_prior() == before[np.ix_(order, order)]).all()
    assert not (model.get_prior() == before).all()

    # a Runner's training loop whose dataset names other classes
    hub.update_info('loop_stage', 'train')
    hub.update_info('dataset_meta', dict(classes=others))
    try:
        model = MODELS.build(copy.deepcopy(model_cfg))
        with pytest.raises(ValueError, match='do not match'):
            model.data_preprocessor(copy.deepcopy(inputs), True)
        data = model.data_preprocessor(copy.deepcopy(inputs), False)
        with pytest.raises(ValueError, match='do not match'):
            model.loss(data['inputs'], data['data_samples'])
    finally:
        hub.pop_info('loop_stage')


@pytest.fixture(scope='session')
def class_order():
    """:func:`check_class_order`."""
    return check_class_order
