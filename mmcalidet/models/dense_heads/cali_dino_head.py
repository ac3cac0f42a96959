# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDINOHead: DINO's head with calibrated classification and LoMa."""
from typing import Dict, List, Optional

from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from torch import Tensor

from .calibrated_cls import CalibratedClsMixin


@MODELS.register_module()
class CaliDINOHead(CalibratedClsMixin, DINOHead):
    """DINO head whose decoder-layer classification branches are
    ``(W + rho * V')^T h + b`` (matching and denoising queries alike), with
    one CaliFormer shared by all decoder layers and a LoMa loss per decoder
    layer on the matching queries.

    The extra classification branch that DINO applies to the encoder output
    for two-stage query selection stays uncalibrated, so the decoder's
    hidden states do not depend on the prior. Box branches are unchanged.

    Args:
        califormer (dict): config of the :class:`CaliFormer`.
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        loma_queries (str): ``'all'`` (the paper's) or ``'matched_class'``
            (see :class:`CalibratedClsMixin`).
        *args, **kwargs: the arguments of mmdet's ``DINOHead``.
    """

    def loss(self,
             hidden_states: Tensor,
             references: List[Tensor],
             enc_outputs_class: Tensor,
             enc_outputs_coord: Tensor,
             batch_data_samples: SampleList,
             dn_meta: Dict[str, int],
             cali_vectors: Optional[Tensor] = None,
             priors: Optional[Tensor] = None) -> dict:
        """DINO's losses with calibrated logits, plus LoMa.

        Args:
            hidden_states (Tensor): (L, B, Q_total, d) decoder outputs.
            references (list[Tensor]): the decoder references.
            enc_outputs_class (Tensor): encoder proposal logits.
            enc_outputs_coord (Tensor): encoder proposal boxes.
            batch_data_samples (list[DetDataSample]): the data samples.
            dn_meta (dict): denoising group information.
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors (B, K, K) or
                (K, K). When both are ``None`` the flat prior E0 is used.

        Returns:
            dict[str, Tensor]: the loss components.
        """
        return self.calibrated_loss(
            hidden_states,
            references,
            enc_outputs_class,
            enc_outputs_coord,
            batch_data_samples,
            cali_vectors,
            priors,
            extra_feat_args=(dn_meta, ),
            matching_scores=lambda *outs: self.split_outputs(*outs, dn_meta)[0]
        )
