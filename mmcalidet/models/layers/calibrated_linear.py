# Copyright (c) mmcalidet contributors. All rights reserved.
"""A linear classifier whose weight follows V': ``W + rho * V'``."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CalibratedLinear(nn.Linear):
    """A box head's linear classifier, calibrated by V'.

    With the calibration vectors V' (K x d) set, it computes
    ``(W + rho * V') x + b`` on its first K outputs by adding ``rho * V'``
    to the weight's first K rows: no extra pass over the features. The
    outputs after the K class logits (a softmax head's background logit)
    stay uncalibrated. Per-row V' (N x K x d, one per RoI) add
    ``rho * V'_n x_n`` to row n's logits instead; per-image V' (B x K x d)
    with ``row_images`` (N,), each row's image index, do the same with V'
    of row n's image, without copying V' for every row. Without V' it is
    the plain linear layer; its parameters keep ``nn.Linear``'s names
    (``weight``, ``bias``), so a trained detector's checkpoint loads.

    Args:
        in_features (int): d.
        out_features (int): the outputs, K or K + 1 with a background
            logit.
        num_classes (int): K.
        bias (bool): as ``nn.Linear``. Defaults to True.
    """

    def __init__(self,
                 in_features: int,
                 out_features: int,
                 num_classes: int,
                 bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        if num_classes > out_features:
            raise ValueError(f'{out_features} outputs cannot hold '
                             f'{num_classes} class logits')
        self.num_classes = num_classes
        #: V', rho and the rows' image indices of the current forward
        #: (set by the head)
        self.cali_vectors: Optional[Tensor] = None
        self.rho = 0.0
        self.row_images: Optional[Tensor] = None

    @classmethod
    def from_linear(cls, linear: nn.Linear,
                    num_classes: int) -> 'CalibratedLinear':
        """The calibrated twin of ``linear``, with its parameters.

        Args:
            linear (nn.Linear): the head's classifier.
            num_classes (int): K, the outputs calibrated (the first K).

        Returns:
            CalibratedLinear: on the device and dtype of ``linear``.
        """
        twin = cls(
            linear.in_features,
            linear.out_features,
            num_classes=num_classes,
            bias=linear.bias is not None)
        twin.load_state_dict(linear.state_dict())
        return twin.to(linear.weight.device, linear.weight.dtype)

    def output_deltas(self, cali_vectors: Tensor) -> Tensor:
        """V' laid out like the weight's rows: (..., out_features, d),
        zero on the outputs after the K class logits."""
        return F.pad(cali_vectors,
                     (0, 0, 0, self.out_features - self.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """The linear layer with ``W + rho * V'`` (see the class).

        Args:
            x (Tensor): (N, d) features.

        Returns:
            Tensor: (N, out_features) outputs.
        """
        cali = self.cali_vectors
        if cali is None:
            return super().forward(x)
        d, k = self.in_features, self.num_classes
        if cali.shape[-2:] != (k, d) or cali.dim() not in (2, 3):
            raise ValueError(f"V' must be (K, d) = ({k}, {d}), (N, K, d) or "
                             f'(B, K, d), got {tuple(cali.shape)}')
        deltas = self.rho * self.output_deltas(cali.to(x.dtype))
        if cali.dim() == 2:
            return F.linear(x, self.weight + deltas, self.bias)
        out = super().forward(x)
        if self.row_images is None:
            if cali.shape[0] != x.shape[0]:
                raise ValueError(f"per-row V' must be (N, K, d) with N = "
                                 f'{x.shape[0]}, got {tuple(cali.shape)}')
            return out + torch.einsum('nd,ncd->nc', x, deltas)
        return out + self._per_image_term(x, deltas)

    def _per_image_term(self, x: Tensor, deltas: Tensor) -> Tensor:
        """``rho * V'_b x_n`` for each row n of image b = ``row_images[n]``,
        one matrix product per image."""
        images = self.row_images.long()
        if images.shape != x.shape[:1]:
            raise ValueError(f'row_images must be ({x.shape[0]},), got '
                             f'{tuple(images.shape)}')
        if images.numel() and not 0 <= int(images.min()) <= int(
                images.max()) < deltas.shape[0]:
            raise ValueError(f"per-image V' holds {deltas.shape[0]} images, "
                             f'the rows name images up to '
                             f'{int(images.max())}')
        term = x.new_zeros(x.shape[0], self.out_features)
        for b in range(deltas.shape[0]):
            rows = images == b
            term = term.index_put((rows, ), x[rows] @ deltas[b].t())
        return term
