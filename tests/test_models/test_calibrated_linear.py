# Copyright (c) mmcalidet contributors. All rights reserved.
"""CalibratedLinear: ``W + rho * V'`` on the first K outputs, one V' folded
into the weight, per-row or per-image V' as an extra term; nn.Linear's
parameters and outputs without V'."""
import pytest
import torch
from torch import nn

from mmcalidet.models.layers import CalibratedLinear

K, D = 4, 6


@pytest.fixture
def layer():
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(D, K + 1)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(K + 1, D, generator=gen))
        linear.bias.copy_(torch.randn(K + 1, generator=gen))
    return linear, CalibratedLinear.from_linear(linear, K)


def test_is_the_linear_layer_with_its_parameters(layer):
    linear, twin = layer
    assert set(twin.state_dict()) == {'weight', 'bias'}
    x = torch.randn(3, D)
    torch.testing.assert_close(twin(x), linear(x))


def test_one_v_prime_calibrates_the_class_logits_only(layer):
    linear, twin = layer
    x = torch.randn(5, D)
    cali = torch.randn(K, D)
    twin.cali_vectors, twin.rho = cali, 0.3
    out = twin(x)
    expected = linear(x)
    expected[:, :K] += 0.3 * x @ cali.t()
    torch.testing.assert_close(out, expected)
    # the background logit stays the linear layer's
    torch.testing.assert_close(out[:, K], linear(x)[:, K])


def test_per_row_and_per_image_v_prime_agree(layer):
    linear, twin = layer
    x = torch.randn(5, D)
    images = torch.tensor([1, 0, 1, 1, 0])
    cali = torch.randn(2, K, D)
    twin.rho = 0.3
    twin.cali_vectors = cali[images]  # one V' per row
    per_row = twin(x)
    twin.cali_vectors, twin.row_images = cali, images
    per_image = twin(x)
    torch.testing.assert_close(per_image, per_row)
    for b in range(2):  # each row reads its image's V'
        twin.cali_vectors, twin.row_images = cali[b], None
        shared = twin(x)
        rows = images == b
        torch.testing.assert_close(per_image[rows], shared[rows])


def test_refuses_v_prime_of_another_shape(layer):
    _, twin = layer
    x = torch.randn(5, D)
    cases = [
        (torch.randn(K, D + 1), None, "V' must"),
        (torch.randn(3, K, D), None, 'per-row'),
        (torch.randn(2, K, D), torch.tensor([0, 1]), 'row_images'),
        (torch.randn(2, K, D), torch.tensor([0, 0, 1, 1, 2]), 'holds 2'),
    ]
    for cali, images, match in cases:
        twin.cali_vectors, twin.row_images = cali, images
        with pytest.raises(ValueError, match=match):
            twin(x)
    with pytest.raises(ValueError, match='class logits'):
        CalibratedLinear(D, K, num_classes=K + 1)
