# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFormer: V' = g(V, Delta E), the per-class calibration vectors."""
from typing import Optional

import torch
from mmdet.models.layers import DetrTransformerEncoder
from mmdet.registry import MODELS
from mmdet.utils import OptMultiConfig
from mmengine.model import BaseModule
from torch import Tensor, nn

from ...utils.validation import check_float
from .prior_ops import prior_delta
from .support_ops import check_support, shrunk_lift, support_features


@MODELS.register_module()
class CaliFormer(BaseModule):
    r"""Encoder-only transformer over class nodes whose self-attention is
    biased by the injected prior (paper Sec. 3.1, Eq. 1):

    .. math::
        A = \mathrm{softmax}(QK^T / \sqrt{d_k} + \Delta E^T) V,
        \qquad \Delta E = E - E_0

    The same bias enters every attention head of every layer: the attention
    of node ``i`` (row) to node ``j`` (column) gets ``Delta E[j, i]``, i.e.
    ``Delta P(j | i)``. There is no positional encoding: the nodes are a
    set, so permuting the classes of ``V`` and ``E`` together permutes
    ``V'``. The layers are mmdet's ``DetrTransformerEncoderLayer`` (post
    norm) with the bias passed as the float ``attn_mask`` of attention.

    Args:
        num_classes (int): K, the number of nodes.
        embed_dims (int): d, the node (and detector) embedding size.
            Defaults to 256.
        num_layers (int): encoder layers. Defaults to 3.
        num_heads (int): attention heads. Defaults to 8.
        feedforward_channels (int): hidden size of the FFN. Defaults to
            2048.
        dropout (float): dropout of attention and FFN. Defaults to 0.
        node_std (float): std of the normal initialisation of the nodes V.
            Defaults to 0.01.
        zero_init_output (bool): initialise the weight of the last layer's
            output LayerNorm to 0, so that V' = 0 and a detector fine-tuned
            from a baseline checkpoint starts exactly as the baseline. With
            the default (False, the paper's plain initialisation) V' starts
            with unit-scale entries. Defaults to False.
        support_features (bool): experimental, off by default.
            The class nodes also receive the prior's support: per class
            ``[log(1 + n), p]`` (n: images the column was measured on, p:
            the class's share of those images, 0 when not given) through a
            zero-initialised linear map added to the nodes, so enabling it
            leaves V' unchanged at initialisation. Defaults to False.
        lift_bias (bool): experimental, off by default. Add
            ``s * L^T`` to the attention bias, with the shrunk lift
            ``L[i, j] = log((P(i|j) + a) / (P(i) + a))`` (0 in columns
            measured on no image), which is exactly 0 on one image's prior;
            ``s`` is a learnable scalar, zero-initialised. Needs ``support``
            and ``marginals`` in :meth:`forward` (else no lift). Defaults to
            False.
        lift_shrink (float): ``a`` of the shrunk lift. Defaults to 0.05.
        init_cfg (dict, optional): mmengine initialisation config.
    """

    def __init__(self,
                 num_classes: int,
                 embed_dims: int = 256,
                 num_layers: int = 3,
                 num_heads: int = 8,
                 feedforward_channels: int = 2048,
                 dropout: float = 0.0,
                 node_std: float = 0.01,
                 zero_init_output: bool = False,
                 support_features: bool = False,
                 lift_bias: bool = False,
                 lift_shrink: float = 0.05,
                 init_cfg: OptMultiConfig = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.num_classes = num_classes
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.node_std = node_std
        self.zero_init_output = zero_init_output
        self.nodes = nn.Parameter(torch.empty(num_classes, embed_dims))
        nn.init.normal_(self.nodes, std=node_std)
        self.encoder = DetrTransformerEncoder(
            num_layers=num_layers,
            layer_cfg=dict(
                self_attn_cfg=dict(
                    embed_dims=embed_dims,
                    num_heads=num_heads,
                    attn_drop=dropout,
                    proj_drop=dropout,
                    # explicit: mmcv's MultiheadAttention writes the
                    # `dropout=` of any earlier one (0.1 in D-DETR's
                    # decoder) into its default dropout_layer, which every
                    # later one built without it then uses
                    dropout_layer=dict(type='Dropout', drop_prob=dropout),
                    batch_first=True),
                ffn_cfg=dict(
                    embed_dims=embed_dims,
                    feedforward_channels=feedforward_channels,
                    num_fcs=2,
                    ffn_drop=dropout,
                    act_cfg=dict(type='ReLU', inplace=True))))
        if zero_init_output:
            nn.init.zeros_(self.encoder.layers[-1].norms[-1].weight)
        lift_shrink = check_float('lift_shrink', lift_shrink, low=0,
                                  low_open=True)
        self.use_support_features = support_features
        self.use_lift_bias = lift_bias
        self.lift_shrink = float(lift_shrink)
        if support_features:
            # skip_init: no draw from the global RNG, so that a seeded build
            # gives the other weights as without the option
            self.support_proj = nn.utils.skip_init(nn.Linear, 2, embed_dims)
        if lift_bias:
            self.lift_scale = nn.Parameter(torch.zeros(()))
        self._zero_init_support()

    def _zero_init_support(self) -> None:
        """Zero the support branches, so that enabling them leaves V'
        unchanged at initialisation."""
        if self.use_support_features:
            nn.init.zeros_(self.support_proj.weight)
            nn.init.zeros_(self.support_proj.bias)
        if self.use_lift_bias:
            nn.init.zeros_(self.lift_scale)

    def init_weights(self) -> None:
        """Nodes from N(0, node_std^2); Xavier for the encoder matrices."""
        nn.init.normal_(self.nodes, std=self.node_std)
        for p in self.encoder.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if self.zero_init_output:
            nn.init.zeros_(self.encoder.layers[-1].norms[-1].weight)
        self._zero_init_support()
        self._is_init = True

    @staticmethod
    def attn_bias(priors: Tensor) -> Tensor:
        """The attention bias ``Delta E^T``: ``bias[..., i, j] = E[..., j, i]
        - E0[j, i]``.

        Args:
            priors (Tensor): (..., K, K) relation matrices.

        Returns:
            Tensor: (..., K, K) bias, rows = queries, columns = keys.
        """
        return prior_delta(priors).transpose(-1, -2)

    def forward(self,
                priors: Tensor,
                support: Optional[Tensor] = None,
                marginals: Optional[Tensor] = None) -> Tensor:
        """Compute the calibration vectors V' for one or a batch of priors.

        Identical priors (with identical support) in a batch are computed
        once.

        Args:
            priors (Tensor): (K, K) or (B, K, K) relation matrices.
            support (Tensor, optional): (K,) or (B, K) images each class
                column was measured on (an image prior: 1). Only read with
                ``support_features`` or ``lift_bias``; ``None`` (or a row
                of zeros: measured on no image): today's V'.
            marginals (Tensor, optional): (K,) or (B, K) each class's share
                of those images, in [0, 1].

        Returns:
            Tensor: (K, d) or (B, K, d), matching ``priors``.
        """
        single = priors.dim() == 2
        if single:
            priors = priors.unsqueeze(0)
        k = self.num_classes
        if priors.dim() != 3 or priors.shape[-2:] != (k, k):
            raise ValueError(f'CaliFormer expects priors of shape (K, K) or '
                             f'(B, K, K) with K={k}, got '
                             f'{tuple(priors.shape)}')
        priors = priors.to(self.nodes.dtype)
        num = priors.shape[0]
        uses_support = self.use_support_features or self.use_lift_bias
        if not uses_support:
            support = marginals = None
        support = check_support(support, num, k, 'support', priors)
        marginals = check_support(marginals, num, k, 'marginals', priors)
        if marginals is not None and bool((marginals > 1).any()):
            raise ValueError('CaliFormer: marginals must lie in [0, 1]')
        inverse = None
        if num > 1:
            parts = [priors.flatten(1)]
            parts += [t for t in (support, marginals) if t is not None]
            distinct, inverse = torch.unique(
                torch.cat(parts, dim=1), dim=0, return_inverse=True)
            priors = distinct[:, :k * k].view(-1, k, k)
            rest = distinct[:, k * k:]
            if support is not None:
                support, rest = rest[:, :k], rest[:, k:]
            if marginals is not None:
                marginals = rest[:, :k]
        bias = self.attn_bias(priors)
        if self.use_lift_bias and support is not None and \
                marginals is not None:
            lift = shrunk_lift(priors, support, marginals, self.lift_shrink)
            bias = bias + self.lift_scale * lift.transpose(-1, -2)
        bias = bias.repeat_interleave(self.num_heads, dim=0)
        nodes = self.nodes.unsqueeze(0).expand(priors.shape[0], -1, -1)
        if self.use_support_features and support is not None:
            # a prior measured on no image (n = 0 everywhere) has no
            # support: its V' is the one without (a graph input of zeros)
            measured = (support > 0).any(-1).to(nodes.dtype)[:, None, None]
            nodes = nodes + measured * self.support_proj(
                support_features(support, marginals))
        out = self.encoder(
            query=nodes, query_pos=None, key_padding_mask=None, attn_mask=bias)
        if inverse is not None:
            out = out[inverse]
        return out[0] if single else out
