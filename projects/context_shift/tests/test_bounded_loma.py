# Copyright (c) mmcalidet contributors. All rights reserved.
"""LoMa on a softmax box head's probabilities (a candidate recipe,
experiments/bounded_loma): the loss is gamma * mean over positive RoIs of
w_y * p_y / K, with p the softmax over the K + 1 logits, in the detector's
RoI loss and in the calibrator's cached-RoI loss alike."""
import torch
from mmdet.structures import DetDataSample

from mmcalidet.apis import init_detector
from mmcalidet.models.detectors.cached_roi_losses import (
    cached_roi_head_losses, calibrated_roi_logits)
from mmcalidet.models.losses import loma_class_weights
from mmcalidet.testing import get_config, random_prior
from projects.context_shift.experiments.bounded_loma.prob_loma import \
    ProbLoMaShared2FCBBoxHead

K = 80


def build_head():
    cfg = get_config('calidet/calidet_faster-rcnn_tiny_coco-mini.py')
    cfg.model.roi_head.bbox_head.type = 'ProbLoMaShared2FCBBoxHead'
    torch.manual_seed(0)
    head = init_detector(cfg, None, device='cpu').roi_head.bbox_head
    assert isinstance(head, ProbLoMaShared2FCBBoxHead)
    return head


def samples_and_priors():
    gen = torch.Generator().manual_seed(0)
    samples = []
    for seed in (1, 2):
        sample = DetDataSample()
        sample.sample_prior = torch.as_tensor(
            random_prior(seed), dtype=torch.float32)
        samples.append(sample)
    priors = torch.stack([
        torch.as_tensor(random_prior(s), dtype=torch.float32) for s in (3, 4)
    ])
    return samples, priors, gen


def expected_loss(head, logits, labels, images, samples, priors):
    probs = logits.softmax(-1)
    sample = torch.stack([s.sample_prior for s in samples])
    w = loma_class_weights(priors, sample)
    pos = (labels < K).nonzero(as_tuple=True)[0]
    terms = probs[pos, labels[pos]] * w[images[pos], labels[pos]]
    return head.loss_loma.loss_weight * terms.sum() / K / len(pos)


def test_the_roi_loss_acts_on_the_target_class_probability():
    head = build_head()
    samples, priors, gen = samples_and_priors()
    cls_score = torch.randn(6, K + 1, generator=gen) * 3
    labels = torch.tensor([1, 2, K, 3, K, 1])
    images = torch.tensor([0, 0, 0, 1, 1, 1])
    cali = head.get_cali_vectors(priors)
    with head.loma_samples(samples), head.calibrated(cali, priors):
        loss = head.roi_loma(cls_score, labels, images, 2)
    torch.testing.assert_close(
        loss, expected_loss(head, cls_score, labels, images, samples, priors))
    # not the logits' LoMa of the default head
    linear = super(ProbLoMaShared2FCBBoxHead, head).loma_inputs(cls_score)
    assert torch.equal(linear, cls_score[:, :K])


def test_the_cached_roi_loss_acts_on_the_target_class_probability():
    head = build_head()
    samples, priors, gen = samples_and_priors()
    hidden = torch.randn(2, 3, head.fc_cls.in_features, generator=gen)
    labels = torch.tensor([[1, 2, K], [3, K, 1]])
    weights = torch.ones(2, 3)
    targets = torch.stack(
        [torch.zeros(2, 3),
         labels.float(), (labels < K).float(), weights], -1)
    cali = head.get_cali_vectors(priors)
    losses = cached_roi_head_losses(head, hidden[None], targets, samples, cali,
                                    priors)
    logits = calibrated_roi_logits(head, hidden, cali).reshape(6, K + 1)
    torch.testing.assert_close(
        losses['loss_loma'],
        expected_loss(head, logits, labels.reshape(-1),
                      torch.tensor([0, 0, 0, 1, 1, 1]), samples, priors))
