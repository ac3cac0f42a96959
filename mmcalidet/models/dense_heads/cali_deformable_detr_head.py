# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDeformableDETRHead: Deformable DETR's head with calibrated
classification and LoMa (the paper's supplementary, "Porting to D-DETR")."""
from typing import List, Optional

from mmdet.models.dense_heads import DeformableDETRHead
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from torch import Tensor

from .calibrated_cls import CalibratedClsMixin


@MODELS.register_module()
class CaliDeformableDETRHead(CalibratedClsMixin, DeformableDETRHead):
    """Deformable DETR head whose decoder-layer classification branches are
    ``(W + rho * V')^T h + b``, with one CaliFormer shared by all decoder
    layers and a LoMa loss per decoder layer.

    The calibration (V', the logits, LoMa) is :class:`CalibratedClsMixin`,
    the same code as ``CaliDINOHead``; this class only passes V' and the
    priors through Deformable DETR's ``loss``. Every query of Deformable
    DETR is a matching query, so LoMa averages over all of them.

    In the two-stage variant the detector applies the extra classification
    branch (``cls_branches[num_decoder_layers]``) to the encoder output to
    select the queries; it stays uncalibrated, so the decoder's hidden
    states do not depend on the prior. Box branches are unchanged.

    Args:
        califormer (dict): config of the :class:`CaliFormer`.
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        loma_queries (str): ``'all'`` (every query) or ``'matched_class'``
            (see :class:`CalibratedClsMixin`).
        *args, **kwargs: the arguments of mmdet's ``DeformableDETRHead``.
    """

    def loss(self,
             hidden_states: Tensor,
             references: List[Tensor],
             enc_outputs_class: Optional[Tensor],
             enc_outputs_coord: Optional[Tensor],
             batch_data_samples: SampleList,
             cali_vectors: Optional[Tensor] = None,
             priors: Optional[Tensor] = None) -> dict:
        """Deformable DETR's losses with calibrated logits, plus LoMa.

        Args:
            hidden_states (Tensor): (L, B, Q, d) decoder outputs.
            references (list[Tensor]): the decoder references.
            enc_outputs_class (Tensor, optional): encoder proposal logits
                (two-stage only, else ``None``).
            enc_outputs_coord (Tensor, optional): encoder proposal boxes
                (two-stage only, else ``None``).
            batch_data_samples (list[DetDataSample]): the data samples.
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors (B, K, K) or
                (K, K). When both are ``None`` the flat prior E0 is used.

        Returns:
            dict[str, Tensor]: the loss components.
        """
        return self.calibrated_loss(hidden_states, references,
                                    enc_outputs_class, enc_outputs_coord,
                                    batch_data_samples, cali_vectors, priors)
