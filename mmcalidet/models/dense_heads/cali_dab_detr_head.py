# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDABDETRHead: DAB-DETR's head with calibrated classification and LoMa
(the worked example of ``docs/user_guides/new_baseline.md``)."""
from functools import partial
from typing import Optional

from mmdet.models.dense_heads import DABDETRHead
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from torch import Tensor

from .calibrated_cls import CalibratedClsMixin


@MODELS.register_module()
class CaliDABDETRHead(CalibratedClsMixin, DABDETRHead):
    """DAB-DETR head whose classifier, one ``fc_cls`` shared by the decoder
    layers, is ``(W + rho * V')^T h + b``, with a LoMa loss per decoder
    layer. Every query of DAB-DETR is a matching query.

    Args:
        califormer (dict): config of the :class:`CaliFormer`.
        rho (float): scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it.
        loma_queries (str): ``'all'`` or ``'matched_class'``.
        *args, **kwargs: the arguments of mmdet's ``DABDETRHead``.
    """

    def loss(self,
             hidden_states: Tensor,
             references: Tensor,
             batch_data_samples: SampleList,
             cali_vectors: Optional[Tensor] = None,
             priors: Optional[Tensor] = None) -> dict:
        """DAB-DETR's losses with calibrated logits, plus LoMa.

        Args:
            hidden_states (Tensor): (L, B, Q, d) decoder outputs.
            references (Tensor): (L, B, Q, 4) decoder references.
            batch_data_samples (list[DetDataSample]): the data samples.
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors (B, K, K) or
                (K, K); with neither, the flat prior E0.

        Returns:
            dict[str, Tensor]: the loss components.
        """
        cali_vectors, priors = self.resolve_priors(hidden_states,
                                                   cali_vectors, priors)
        outs = self(hidden_states, references, cali_vectors)
        self.check_finite_outputs(*outs, hidden_states, cali_vectors)
        return self.loss_with_loma(
            partial(self.loss_by_feat, *outs,
                    [ds.gt_instances for ds in batch_data_samples],
                    [ds.metainfo for ds in batch_data_samples]), outs[0],
            priors, batch_data_samples, hidden_states)
