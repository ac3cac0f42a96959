# Copyright (c) mmcalidet contributors. All rights reserved.
"""DenseHeadOutputs: a one-stage head runs once per cached image, and the
class scores under any V' are the kept scores plus rho V'^T x, as the
head's calibrated convs give them; a head whose scores are not its
classification convs' outputs is refused. Random weights: only the
equality of two paths is asserted."""
import pytest
import torch
from torch import nn

from mmcalidet.evaluation.dense_outputs import DenseHeadOutputs
from mmcalidet.models.layers import CalibratedConv2d

K, D = 3, 4


class TinyDenseHead(nn.Module):
    """Two levels, a 3 x 3 calibrated classification conv and a box conv
    each; counts its forwards."""

    def __init__(self, extra: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.num_classes, self.rho, self.extra = K, 0.7, extra
        self.convs = nn.ModuleList(
            CalibratedConv2d(D, 2 * K, 3, num_classes=K, padding=1)
            for _ in range(2))
        self.reg = nn.ModuleList(nn.Conv2d(D, 4, 1) for _ in range(2))
        self.forwards = 0

    #: a calibrated dense head (mmcalidet.models.head_kinds)
    head_kind = 'dense'
    cls_conv_name = 'convs'

    def calibrated_feature_dims(self) -> int:
        return D

    def forward(self, feats, cali_vectors=None):
        self.forwards += 1
        for conv in self.convs:
            conv.cali_vectors, conv.rho = cali_vectors, self.rho
        try:
            scores = [c(x) for c, x in zip(self.convs, feats)]
            if self.extra:  # scores that are not the convs' outputs
                scores = [s + self.extra for s in scores]
            return scores, [r(x) for r, x in zip(self.reg, feats)]
        finally:
            for conv in self.convs:
                conv.cali_vectors = None


def feats_of(num):
    gen = torch.Generator().manual_seed(num)
    return [(torch.randn(D, 5, 5,
                         generator=gen), torch.randn(D, 3, 3, generator=gen))
            for _ in range(num)]


def batch(images, idx):
    return tuple(
        torch.stack([images[k][level] for k in idx]) for level in range(2))


@pytest.mark.parametrize('per_image', [False, True])
def test_scores_under_any_v_prime_equal_the_calibrated_head(per_image):
    head = TinyDenseHead()
    images = feats_of(4)
    outputs = DenseHeadOutputs(head)
    gen = torch.Generator().manual_seed(1)
    for idx in ([0, 1, 2], [3, 1], [2, 0, 3, 1]):
        shape = (len(idx), K, D) if per_image else (K, D)
        cali = torch.randn(*shape, generator=gen)
        outs, inputs = outputs.get(idx, lambda idx=idx: batch(images, idx))
        scores = outputs.calibrated_scores(outs[0], inputs, cali)
        with torch.no_grad():
            want_scores, want_boxes = head(batch(images, idx), cali)
        for got, want in zip(scores, want_scores):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for got, want in zip(outs[1], want_boxes):
            torch.testing.assert_close(got, want)
        # V' moves the scores: the equality tells V' apart
        assert not torch.allclose(scores[0], outs[0][0])


def test_the_head_runs_once_per_image_whatever_the_priors():
    head = TinyDenseHead()
    images = feats_of(4)
    outputs = DenseHeadOutputs(head)
    asked = []

    def feats(idx):
        asked.append(list(idx))
        return batch(images, idx)

    with torch.no_grad():
        outputs.get([0, 1], lambda: feats([0, 1]))
        outputs.get([1, 0], lambda: feats([1, 0]))
        outputs.get([2, 3], lambda: feats([2, 3]))
        outputs.get([3, 0, 2, 1], lambda: feats([3, 0, 2, 1]))
    assert head.forwards == 2 and asked == [[0, 1], [2, 3]]
    assert outputs.nbytes == 4 * 4 * (2 * K + 4 + D) * (25 + 9)


def test_a_plain_head_is_kept_as_it_outputs():
    head = TinyDenseHead()
    images = feats_of(2)
    plain = nn.Module()  # a plain head: no calibrated convs
    plain.forward = lambda feats: head(feats)
    outputs = DenseHeadOutputs(plain)
    assert not outputs.calibratable
    outs, inputs = outputs.get([0, 1], lambda: batch(images, [0, 1]))
    assert inputs == []
    with torch.no_grad():
        want = head(batch(images, [0, 1]))
    for got, exp in zip(outs[0] + outs[1], want[0] + want[1]):
        torch.testing.assert_close(got, exp)


def test_scores_that_are_not_the_convs_outputs_are_refused():
    outputs = DenseHeadOutputs(TinyDenseHead(extra=1.0))
    images = feats_of(2)
    with pytest.raises(TypeError, match='not its classification convs'):
        outputs.get([0, 1], lambda: batch(images, [0, 1]))
