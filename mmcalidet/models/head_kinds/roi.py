# Copyright (c) mmcalidet contributors. All rights reserved.
"""The RoI kind: a two-stage detector's box head, whose one linear
classifier (mmdet's ``fc_cls``: K + 1 softmax logits, the last one
background) classifies every RoI.

Only the classifier depends on the prior: the RPN, the RoI features and
the shared fcs do not. A cache of this kind holds the classifier's input
of the RoIs one training loss sampled (:mod:`mmcalidet.decoder_cache.roi`);
the calibrator's loss is the box head's cross-entropy of those RoIs, over
mmdet's ``BBoxHead.loss`` average factor (the batch's RoIs of positive
label weight, at least 1), its accuracy, and LoMa on the positives'
target class.
"""
import contextlib
from typing import Dict, Iterator, List

import torch
import torch.nn.functional as F
from mmdet.models.losses import accuracy
from mmdet.structures import SampleList
from torch import Tensor, nn

from ..layers.calibration_term import add_calibration
from .base import HeadKind, register_head_kind


class RoIKind(HeadKind):
    """The adapter of two-stage box heads (see the module)."""
    name = 'roi'
    export_name = 'roi'
    words = 'a two-stage box head\'s RoIs'
    feature_cache = True
    softmax = True
    cache_writer = 'mmcalidet.decoder_cache.roi:fill_roi_cache'
    rescorer = 'mmcalidet.evaluation.head_scoring:HeadRescorer'
    head_outputs = 'mmcalidet.evaluation.roi_outputs:RoIHeadOutputs'
    export_wrapper = 'mmcalidet.deploy.two_stage_export:RoIExportWrapper'
    export_outputs = ('boxes', 'scores')
    export_settings = 'mmcalidet.deploy.export_meta:roi_export_settings'
    export_rewrites = 'mmcalidet.deploy.two_stage_export:two_stage_rewrites'

    def claims(self, model: nn.Module) -> bool:
        """A two-stage detector (mmdet's ``TwoStageDetector``) with a RoI
        head that has a box head."""
        from mmdet.models.detectors import TwoStageDetector
        return isinstance(model, TwoStageDetector) and hasattr(
            getattr(model, 'roi_head', None), 'bbox_head')

    def head(self, model: nn.Module) -> nn.Module:
        """The RoI head's box head."""
        return model.roi_head.bbox_head

    def cls_layer(self, head: nn.Module) -> nn.Linear:
        """The box head's linear classifier, checked.

        Raises:
            TypeError: the head has no linear K + 1 softmax classifier (a
                sigmoid or a custom classification loss).
        """
        fc = getattr(head, 'fc_cls', None)
        num_classes = getattr(head, 'num_classes', None)
        if not isinstance(fc, nn.Linear) or \
                not hasattr(head, 'loss_and_target') or \
                getattr(head, 'custom_cls_channels', False) or \
                fc.out_features != (num_classes or 0) + 1:
            raise TypeError(
                f'{type(head).__name__} is not a box head whose linear K + 1 '
                'softmax classifier a RoI cache can hold')
        return fc

    def cls_layers(self, head: nn.Module) -> Dict[str, nn.Module]:
        """The linear classifier, by its name in the head."""
        return dict(fc_cls=self.cls_layer(head))

    def feature_width(self, head: nn.Module) -> int:
        """d, the classifier's input width."""
        return int(self.cls_layer(head).weight.shape[1])

    def class_weight(self, head: nn.Module) -> Tensor:
        """W: the classifier's K class rows (not the background's)."""
        return self.cls_layer(head).weight[:head.num_classes]

    def fold(self, head: nn.Module, cali_vectors: Tensor) -> None:
        """``rho V'`` added to the K class rows; ``rho`` 0."""
        fc = self.cls_layer(head)
        fc.weight[:cali_vectors.shape[0]] += head.rho * cali_vectors.to(
            fc.weight.dtype)
        head.rho = 0.0

    def plain_logits(self, head: nn.Module, features: Tensor) -> Tensor:
        """The plain (K + 1) logits of RoIs whose classifier input is
        ``features`` (N, d)."""
        return self.cls_layer(head)(features)

    @contextlib.contextmanager
    def recording_inputs(self, head: nn.Module) -> Iterator[List[Tensor]]:
        """Inside the block, the input of every classifier call, in call
        order."""
        seen: List[Tensor] = []
        hook = self.cls_layer(head).register_forward_pre_hook(
            lambda module, args: seen.append(args[0]))
        try:
            yield seen
        finally:
            hook.remove()

    def calibrated_logits(self,
                          head: nn.Module,
                          hidden: Tensor,
                          cali_vectors: Tensor,
                          train_cls: bool = False) -> Tensor:
        """``(W + rho V') h + b`` of cached RoIs, (B, Q, K + 1): the K
        class logits calibrated, the background logit plain.

        Args:
            head (nn.Module): a calibrated box head.
            hidden (Tensor): (B, Q, d) cached features.
            cali_vectors (Tensor): V', (K, d) or (B, K, d).
            train_cls (bool): let gradients reach ``W`` and ``b``.
        """
        fc = self.cls_layer(head)
        with torch.set_grad_enabled(train_cls and torch.is_grad_enabled()):
            logits = F.linear(hidden, fc.weight, fc.bias)
        deltas = fc.output_deltas(cali_vectors.to(hidden.dtype))
        return add_calibration(logits, hidden, deltas, head.rho)

    def cached_losses(self, head: nn.Module, batch_inputs: Dict[str, Tensor],
                      batch_data_samples: SampleList, cali_vectors: Tensor,
                      priors: Tensor, train_cls: bool) -> Dict[str, Tensor]:
        """The box head's classification losses of cached RoIs (see the
        module); ``targets`` (B, Q, 4) holds each RoI's level (0), label
        (K: background), positive and label weight (padding: weight 0).

        Returns:
            dict[str, Tensor]: ``loss_cls``, ``acc`` and, with LoMa,
            ``loss_loma``.
        """
        hidden = batch_inputs['hidden_states'][-1]
        _, labels, _, weights = batch_inputs['targets'].unbind(-1)
        logits = self.calibrated_logits(head, hidden, cali_vectors, train_cls)
        k = head.num_classes
        labels = torch.where(weights > 0, labels.long(), k)
        used = weights > 0
        # BBoxHead.loss: the batch's RoIs of positive label weight, at
        # least 1
        avg_factor = max(float(used.sum()), 1.0)
        flat = logits.reshape(-1, logits.shape[-1])
        losses = dict(
            loss_cls=head.loss_cls(
                flat,
                labels.reshape(-1),
                weights.reshape(-1),
                avg_factor=avg_factor),
            acc=accuracy(logits[used], labels[used]))
        if head.loss_loma is not None:
            losses['loss_loma'] = head.matched_class_loma(
                head.loma_inputs(logits), labels, priors,
                head.get_sample_priors(batch_data_samples, logits))
        return losses


#: the RoI kind's adapter
ROI = register_head_kind(RoIKind())
