# Copyright (c) mmcalidet contributors. All rights reserved.
"""A classification conv whose weight follows V': ``W + rho * V'``."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CalibratedConv2d(nn.Conv2d):
    """A dense head's classification conv, calibrated by V'.

    A conv classifier is a linear classifier per location: ``W^T x + b``
    over the feature x of each location (its kernel's centre for a k x k
    conv with ``padding = k // 2``). With the calibration vectors V'
    (K x d) set, it computes ``(W + rho * V')^T x + b`` by adding
    ``rho * V'`` to the centre of the kernel: no extra pass over the
    features. Per-image V' (B x K x d) add ``rho * V'_b^T x`` to image b's
    logits instead. Without V' it is the plain conv; its parameters keep
    the conv's names (``weight``, ``bias``), so a trained detector's
    checkpoint loads.

    The output channels are ``num_base_priors`` groups of
    ``cls_out_channels`` (mmdet's layout); the first K channels of each
    group are the class logits, a softmax head's background logit stays
    uncalibrated.

    Args:
        in_channels, out_channels, kernel_size, padding: as ``nn.Conv2d``.
        num_classes (int): K.
        cls_out_channels (int, optional): the channels of one base prior
            (K, or K + 1 with a background logit); defaults to
            ``out_channels``.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int,
                 num_classes: int,
                 cls_out_channels: Optional[int] = None,
                 **kwargs) -> None:
        super().__init__(in_channels, out_channels, kernel_size, **kwargs)
        cls_out_channels = cls_out_channels or out_channels
        if num_classes > cls_out_channels or out_channels % cls_out_channels:
            raise ValueError(
                f'{out_channels} output channels cannot hold groups of '
                f'{cls_out_channels} channels with {num_classes} class logits')
        self.num_classes = num_classes
        self.cls_out_channels = cls_out_channels
        #: V' and rho of the current forward (set by the head)
        self.cali_vectors: Optional[Tensor] = None
        self.rho = 0.0

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, num_classes: int,
                  cls_out_channels: int) -> 'CalibratedConv2d':
        """The calibrated twin of ``conv``, with its parameters.

        Args:
            conv (nn.Conv2d): the head's classification conv.
            num_classes (int): K.
            cls_out_channels (int): the channels of one base prior (K, or
                K + 1 with a background logit).
        """
        if conv.out_channels % cls_out_channels or conv.groups != 1 or \
                conv.kernel_size[0] != conv.kernel_size[1]:
            raise ValueError(
                'a calibrated classification conv must be an ungrouped, '
                f'square conv with a multiple of {cls_out_channels} '
                f'output channels, got {conv}')
        if conv.padding != (conv.kernel_size[0] // 2, ) * 2:
            raise ValueError('the conv must keep the feature map size '
                             f'(padding = kernel_size // 2), got {conv}')
        twin = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size[0],
            num_classes=num_classes,
            cls_out_channels=cls_out_channels,
            stride=conv.stride,
            padding=conv.padding,
            bias=conv.bias is not None)
        twin.load_state_dict(conv.state_dict())
        return twin.to(conv.weight.device, conv.weight.dtype)

    def channel_deltas(self, cali_vectors: Tensor) -> Tensor:
        """V' laid out like the output channels: (..., C_out, d), zero on
        background channels."""
        cls_out = self.cls_out_channels
        pad = cls_out - self.num_classes
        if pad:
            cali_vectors = F.pad(cali_vectors, (0, 0, 0, pad))
        reps = self.out_channels // cls_out
        if reps > 1:
            cali_vectors = torch.cat([cali_vectors] * reps, dim=-2)
        return cali_vectors

    def forward(self, x: Tensor) -> Tensor:
        """The conv with ``W + rho * V'`` (see the class)."""
        cali = self.cali_vectors
        if cali is None:
            return super().forward(x)
        d, k = self.in_channels, self.num_classes
        if cali.shape[-2:] != (k, d):
            raise ValueError(f"V' must be (K, d) = ({k}, {d}) or (B, K, d), "
                             f'got {tuple(cali.shape)}')
        deltas = self.rho * self.channel_deltas(cali.to(x.dtype))
        if cali.dim() == 2:
            # a static shape: ONNX's exporter needs the kernel's
            kernel = deltas.reshape(self.out_channels, self.in_channels, 1, 1)
            centre = self.kernel_size[0] // 2
            if centre:  # zeros around it, by concatenation (ONNX's Pad
                # would leave the kernel's shape unknown)
                side = kernel.new_zeros(self.out_channels, self.in_channels, 1,
                                        centre)
                band = kernel.new_zeros(self.out_channels, self.in_channels,
                                        centre, self.kernel_size[1])
                kernel = torch.cat(
                    [band, torch.cat([side, kernel, side], 3), band], 2)
            return self._conv_forward(x, self.weight + kernel, self.bias)
        if cali.dim() != 3 or cali.shape[0] != x.shape[0]:
            raise ValueError(f"per-image V' must be (B, K, d) with B = "
                             f'{x.shape[0]}, got {tuple(cali.shape)}')
        return super().forward(x) + torch.einsum('bdhw,bcd->bchw', x, deltas)
