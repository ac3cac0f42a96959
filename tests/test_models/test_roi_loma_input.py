# Copyright (c) mmcalidet contributors. All rights reserved.
"""A box head's ``loma_input``: LoMa on the target class's logit (the
default) or on its softmax probability (``'softmax'``: gamma * mean over
positive RoIs of w_y * p_y / K, p the softmax over the K + 1 logits), in
the detector's RoI loss and in the calibrator's cached-RoI loss alike."""
import pytest
import torch
from mmdet.structures import DetDataSample

from mmcalidet.apis import init_detector
from mmcalidet.models.head_kinds import ROI
from mmcalidet.models.losses import loma_class_weights
from mmcalidet.models.roi_heads import CaliShared2FCBBoxHead
from testing import get_config, random_prior

K = 80


@pytest.fixture(scope='module')
def softmax_head():
    """The tiny CaliFasterRCNN's box head, built from its config with
    ``loma_input='softmax'``."""
    cfg = get_config('calidet/calidet_faster-rcnn_tiny_coco-mini.py')
    cfg.model.roi_head.bbox_head.loma_input = 'softmax'
    torch.manual_seed(0)
    head = init_detector(cfg, None, device='cpu').roi_head.bbox_head
    assert isinstance(head, CaliShared2FCBBoxHead)
    assert head.loma_input == 'softmax'
    return head


def samples_and_priors():
    """Two images' E_x (in their data samples) and injected priors."""
    samples = []
    for seed in (1, 2):
        sample = DetDataSample()
        sample.sample_prior = torch.as_tensor(
            random_prior(seed), dtype=torch.float32)
        samples.append(sample)
    priors = torch.stack([
        torch.as_tensor(random_prior(s), dtype=torch.float32) for s in (3, 4)
    ])
    return samples, priors, torch.Generator().manual_seed(0)


def expected_loss(head, logits, labels, images, samples, priors):
    """The paper's LoMa by hand, on the logits or their softmax."""
    values = logits.softmax(-1) if head.loma_input == 'softmax' else logits
    sample = torch.stack([s.sample_prior for s in samples])
    w = loma_class_weights(priors, sample)
    pos = (labels < K).nonzero(as_tuple=True)[0]
    terms = values[pos, labels[pos]] * w[images[pos], labels[pos]]
    return head.loss_loma.loss_weight * terms.sum() / K / len(pos)


@pytest.mark.parametrize('loma_input', ['softmax', 'logits'])
def test_the_roi_loss_acts_on_the_chosen_input(softmax_head, loma_input,
                                               monkeypatch):
    head = softmax_head
    monkeypatch.setattr(head, 'loma_input', loma_input)
    samples, priors, gen = samples_and_priors()
    cls_score = torch.randn(6, K + 1, generator=gen) * 3
    labels = torch.tensor([1, 2, K, 3, K, 1])
    images = torch.tensor([0, 0, 0, 1, 1, 1])
    cali = head.get_cali_vectors(priors)
    with head.loma_samples(samples), head.calibrated(cali, priors):
        loss = head.roi_loma(cls_score, labels, images, 2)
    torch.testing.assert_close(
        loss, expected_loss(head, cls_score, labels, images, samples, priors))


def test_the_cached_roi_loss_acts_on_the_target_class_probability(
        softmax_head):
    head = softmax_head
    samples, priors, gen = samples_and_priors()
    hidden = torch.randn(2, 3, head.fc_cls.in_features, generator=gen)
    labels = torch.tensor([[1, 2, K], [3, K, 1]])
    targets = torch.stack([
        torch.zeros(2, 3),
        labels.float(), (labels < K).float(),
        torch.ones(2, 3)
    ], -1)
    cali = head.get_cali_vectors(priors)
    losses = ROI.cached_losses(
        head, dict(hidden_states=hidden[None], targets=targets), samples,
        cali, priors, train_cls=False)
    logits = ROI.calibrated_logits(head, hidden, cali).reshape(6, K + 1)
    torch.testing.assert_close(
        losses['loss_loma'],
        expected_loss(head, logits, labels.reshape(-1),
                      torch.tensor([0, 0, 0, 1, 1, 1]), samples, priors))


def test_an_unknown_loma_input_is_refused():
    with pytest.raises(ValueError, match='loma_input must be one of'):
        CaliShared2FCBBoxHead(num_classes=K, loma_input='sigmoid')
