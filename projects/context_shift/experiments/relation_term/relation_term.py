# Copyright (c) mmcalidet contributors. All rights reserved.
"""A learned relation term: a site's relations act through what the image
shows (a candidate of the project README, "A site's relations through the
image").

V' = g(E) is one vector per class for every image, so P(i | j) cannot act
where j is in *this* image. Here a second term does, per image: with the
image's class evidence ``e`` (per class, the max over queries of the
uncalibrated score, ``sigmoid(W h + b)``: the frozen baseline's, never a
calibrated one) and pair weights ``a_ij(E)`` computed once per prior from
the CaliFormer's output nodes V',

    logit_iq += rho2 * sum_{j != i} a_ij e_j / (1 + sum_{j != i} e_j),
    a_ij = s * (U V'_i) . (W V'_j) / sqrt(r),

a co-occurrence rescoring whose strength and form are learned (``s`` starts
at 0: the term starts off). Its per-image cost is K^2, with no transformer
pass. In training the evidence is dropped per class with probability
``evidence_drop`` (a site's scores are less clean than a training
image's).
"""
import math

import torch
from mmdet.registry import MODELS
from torch import Tensor, nn

from mmcalidet.models.dense_heads import CaliDINOHead
from mmcalidet.models.layers import CaliFormer


@MODELS.register_module()
class RelationCaliFormer(CaliFormer):
    """A :class:`~mmcalidet.models.layers.CaliFormer` that also gives pair
    weights ``a_ij(E)`` from its output nodes V' (trained with it: the
    cached calibrator trains the CaliFormer only).

    Args:
        relation_rank (int): r, the width of the pair projections.
            Defaults to 32.
        *args, **kwargs: the CaliFormer's.
    """

    def __init__(self, *args, relation_rank: int = 32, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.relation_rank = int(relation_rank)
        self.pair_query = nn.Linear(
            self.embed_dims, self.relation_rank, bias=False)
        self.pair_key = nn.Linear(
            self.embed_dims, self.relation_rank, bias=False)
        self.relation_scale = nn.Parameter(torch.zeros(()))

    def init_weights(self) -> None:
        super().init_weights()
        nn.init.xavier_uniform_(self.pair_query.weight)
        nn.init.xavier_uniform_(self.pair_key.weight)
        nn.init.zeros_(self.relation_scale)

    def pair_weights(self, cali_vectors: Tensor) -> Tensor:
        """a (K, K) or (B, K, K) of V' (K, d) or (B, K, d), zero diagonal."""
        query = self.pair_query(cali_vectors)
        key = self.pair_key(cali_vectors)
        weights = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(
            self.relation_rank)
        k = weights.shape[-1]
        off = 1 - torch.eye(k, dtype=weights.dtype, device=weights.device)
        return self.relation_scale * weights * off


class RelationTermMixin:
    """The relation term of a calibrated DETR head (see the module); its
    CaliFormer must be a :class:`RelationCaliFormer`.

    Args:
        relation_rho (float): rho2, the term's scale. Defaults to 1.0.
        evidence_drop (float): the evidence dropout in training. Defaults
            to 0.1.
    """

    def __init__(self,
                 *args,
                 relation_rho: float = 1.0,
                 evidence_drop: float = 0.1,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self.califormer, 'pair_weights'):
            raise TypeError('the relation term needs a RelationCaliFormer, '
                            f'got {type(self.califormer).__name__}')
        self.relation_rho = float(relation_rho)
        self.evidence_drop = float(evidence_drop)

    def evidence(self, raw_scores: Tensor) -> Tensor:
        """e (L, B, K): each layer's max uncalibrated score per class."""
        k = self.num_classes
        evidence = raw_scores[..., :k].detach().sigmoid().amax(dim=2)
        if self.training and self.evidence_drop > 0:
            keep = torch.rand_like(evidence) >= self.evidence_drop
            evidence = evidence * keep
        return evidence

    def calibrate_cls_scores(self, all_layers_cls_scores: Tensor,
                             hidden_states: Tensor,
                             cali_vectors: Tensor) -> Tensor:
        """``rho V'^T h`` (the calibrated head's), then the relation term of
        each image's evidence."""
        out = super().calibrate_cls_scores(all_layers_cls_scores,
                                           hidden_states, cali_vectors)
        weights = self.califormer.pair_weights(cali_vectors)
        evidence = self.evidence(all_layers_cls_scores)  # (L, B, K)
        if weights.dim() == 2:
            num = torch.einsum('ij,lbj->lbi', weights, evidence)
        else:
            num = torch.einsum('bij,lbj->lbi', weights, evidence)
        den = 1 + evidence.sum(-1, keepdim=True) - evidence
        shift = self.relation_rho * num / den
        pad = out.shape[-1] - shift.shape[-1]
        if pad:
            shift = nn.functional.pad(shift, (0, pad))
        return out + shift[:, :, None, :].to(out.dtype)


@MODELS.register_module()
class RelationCaliDINOHead(RelationTermMixin, CaliDINOHead):
    """:class:`~mmcalidet.models.dense_heads.CaliDINOHead` with the learned
    relation term (:class:`RelationTermMixin`)."""
