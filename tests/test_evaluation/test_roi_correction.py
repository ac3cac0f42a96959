# Copyright (c) mmcalidet contributors. All rights reserved.
"""The marginal re-weighting of a plain two-stage detector's RoI head
(mmcalidet/evaluation/roi_correction.py): on the softmax it is Saerens et
al.'s form, p'(k) proportional to p(k) pi_target(k) / pi_source(k) with
the background's kept; each RoI gets its own image's prior; a correction
with no softmax form is refused by name. (HeadRescorer's re-weighted
Faster R-CNN: tests/test_evaluation/test_head_rescorer.py.)"""
import numpy as np
import pytest
import torch

from mmcalidet.evaluation import CooccurrenceRescoring, PriorReweighting
from mmcalidet.evaluation.roi_correction import (check_softmax_correction,
                                                 corrected_roi_scores)
from testing import random_prior

K = 80


def reweighting(seed=13):
    """A re-weighting with E_ref = random_prior(seed) and spread
    frequencies."""
    return PriorReweighting(random_prior(seed), np.linspace(0.05, 0.5, K))


def test_the_softmax_shift_is_saerens_form_and_0_at_e_ref():
    corr = reweighting()
    prior = torch.as_tensor(random_prior(17))
    logits = torch.randn(5, K + 1, dtype=torch.float64)
    shift = corr.softmax_shift(prior)
    assert shift.shape == (K, )
    corrected = torch.cat([logits[:, :K] + shift, logits[:, K:]], 1)
    freq = torch.as_tensor(corr.class_freq)
    ratio = torch.cat([corr.target_marginals(prior) / freq, torch.ones(1)])
    expected = logits.softmax(-1) * ratio
    torch.testing.assert_close(corrected.softmax(-1),
                               expected / expected.sum(-1, keepdim=True))
    e_ref = torch.as_tensor(corr.ref_prior)
    torch.testing.assert_close(
        corr.softmax_shift(e_ref), torch.zeros(K, dtype=torch.float64))
    assert corr.softmax_shift(torch.stack([e_ref, prior])).shape == (2, K)


def test_each_roi_is_shifted_by_its_own_images_prior():
    corr = reweighting()
    priors = torch.as_tensor(np.stack([random_prior(3), random_prior(5)]),
                             dtype=torch.float32)
    cls_score = torch.randn(3, K + 1)
    images = torch.tensor([1., 0., 1.])  # rois[:, 0]
    out = corrected_roi_scores(cls_score, corr, priors, images)
    shift = corr.softmax_shift(priors)
    for row, image in enumerate([1, 0, 1]):
        torch.testing.assert_close(out[row, :K],
                                   cls_score[row, :K] + shift[image])
        assert out[row, K] == cls_score[row, K]  # background kept
    # a shared prior: every RoI the same shift
    shared = corrected_roi_scores(cls_score, corr, priors[0], images)
    torch.testing.assert_close(shared[:, :K] - cls_score[:, :K],
                               shift[0].expand(3, K))


def test_a_correction_without_a_softmax_form_is_refused_by_name():
    with pytest.raises(ValueError, match='CooccurrenceRescoring acts on '
                       'sigmoid class logits only; FasterRCNN'):
        check_softmax_correction(
            CooccurrenceRescoring(random_prior(1)), 'FasterRCNN')
    check_softmax_correction(reweighting(), 'FasterRCNN')
