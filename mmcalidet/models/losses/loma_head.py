# Copyright (c) mmcalidet contributors. All rights reserved.
"""What every head with LoMa needs: the loss and each image's E_x.

Which logits LoMa acts on depends on the head: a DETR head's matching
queries (:class:`LoMaQueriesMixin`), a one-stage head's positive
locations (:class:`~mmcalidet.models.dense_heads.CalibratedDenseClsMixin`).
"""
import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.utils import OptConfigType
from torch import Tensor

from ...priors import label_lists_prior


class LoMaMixin:
    """A head's LoMa loss and the per-image statistics E_x it compares the
    injected prior with.

    Args:
        loss_loma (dict, optional): config of the :class:`LoMaLoss`;
            ``None`` disables it. Defaults to
            ``dict(type='LoMaLoss', loss_weight=20.0)``.
    """

    def __init__(self,
                 *args,
                 loss_loma: OptConfigType = dict(
                     type='LoMaLoss', loss_weight=20.0),
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loss_loma = MODELS.build(loss_loma) \
            if loss_loma is not None else None

    def get_sample_priors(self, batch_data_samples: SampleList,
                          like: Tensor) -> Tensor:
        """E_x of every image: the ``sample_prior`` field the EdgeSampler
        attaches, else computed from ``gt_instances`` (crowd boxes, kept in
        ``ignored_instances`` by mmdet, do not count).

        Args:
            batch_data_samples (list[DetDataSample]): the data samples.
            like (Tensor): gives the dtype and device.

        Returns:
            Tensor: (B, K, K).
        """
        found = [ds.get('sample_prior', None) for ds in batch_data_samples]
        if all(p is not None for p in found):
            return torch.stack([
                torch.as_tensor(p, dtype=like.dtype, device=like.device)
                for p in found
            ])
        label_lists = [
            ds.gt_instances.labels.detach().cpu().numpy()
            for ds in batch_data_samples
        ]
        stats = label_lists_prior(label_lists, self.num_classes)
        return torch.as_tensor(
            stats.astype(np.float32), dtype=like.dtype, device=like.device)

    def matched_class_loma(self, cls_scores: Tensor, labels: Tensor,
                           priors: Tensor, sample_priors: Tensor) -> Tensor:
        """LoMa on the logit of each assigned prediction's target class,
        averaged over the assigned predictions.

        Args:
            cls_scores (Tensor): (B, N, C) logits of N predictions (queries
                or locations) per image.
            labels (Tensor): (B, N) their target labels (background: any
                label >= K).
            priors (Tensor): the injected priors, (B, K, K) or (K, K).
            sample_priors (Tensor): E_x, (B, K, K).

        Returns:
            Tensor: the loss.
        """
        k = self.num_classes
        pos = (labels >= 0) & (labels < k)
        mask = torch.zeros((*labels.shape, k),
                           dtype=cls_scores.dtype,
                           device=cls_scores.device)
        mask[pos] = torch.nn.functional.one_hot(labels[pos].long(),
                                                k).to(mask.dtype)
        return self.loss_loma(
            cls_scores,
            priors,
            sample_priors,
            class_mask=mask,
            avg_factor=max(float(pos.sum()), 1.0))
