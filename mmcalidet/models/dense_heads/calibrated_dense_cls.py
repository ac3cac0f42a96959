# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrated classification for one-stage dense heads.

A one-stage head classifies every location of every level with a conv
(one per level, or one the levels share): a linear classifier per
location. The mixin swaps
each level's classification conv for a :class:`CalibratedConv2d` with the
same parameters, so every level computes ``(W_l + rho * V')^T x + b_l``
with one V' from the head's CaliFormer. The towers, the box branch and the
post-processing stay the wrapped head's.

The detector passes V' (and, in training, the injected priors) for the
length of a forward through :meth:`CalibratedDenseClsMixin.calibrated`;
LoMa acts on the logit of each positive location's assigned class.
"""
from typing import Dict, List, Optional, Tuple

from mmdet.structures import SampleList
from torch import Tensor, nn

from ..head_kinds.dense import DENSE
from ..layers import CalibratedConv2d
from ..losses.loma_head import LoMaMixin
from .califormer_head import CalibrationContextMixin


class CalibratedDenseClsMixin(LoMaMixin, CalibrationContextMixin):
    """Mixin for one-stage heads with calibrated classification convs.

    Put it before the head class: ``class CaliXHead(CalibratedDenseClsMixin,
    XHead)`` and name the head's classification conv(s) in
    ``cls_conv_name`` (a conv or a ``ModuleList`` of one per level). The
    head class records the assigner's labels in ``get_targets`` with
    :meth:`record_targets` (see ``CaliRTMDetHead``).

    Args:
        califormer (dict): config of the :class:`CaliFormer`; its
            ``embed_dims`` defaults to the classification convs' input
            channels (the head's ``feat_channels``).
        rho (float): the scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`, on
            the assigned class of the positive locations; ``None``
            disables it.
    """

    #: the head kind (:mod:`mmcalidet.models.head_kinds`)
    head_kind = 'dense'
    #: the attribute holding the classification conv(s)
    cls_conv_name = 'conv_cls'

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        convs = getattr(self, self.cls_conv_name)
        if isinstance(convs, nn.Conv2d):
            setattr(self, self.cls_conv_name, self._calibrated(convs))
        else:
            for level, conv in enumerate(convs):
                convs[level] = self._calibrated(conv)
        # the assigned labels, recorded by get_targets inside loss()
        self._targets_record: Optional[List[Tuple[Tensor, Tensor]]] = None

    def _calibrated(self, conv: nn.Conv2d) -> CalibratedConv2d:
        return CalibratedConv2d.from_conv(conv, self.num_classes,
                                          self.cls_out_channels)

    def calibrated_feature_dims(self) -> int:
        """d: the input channels of the classification convs."""
        return self.feat_channels

    def dense_cls_convs(self) -> Dict[str, CalibratedConv2d]:
        """The calibrated classification convs by name in the head, each
        once (:meth:`~mmcalidet.models.head_kinds.DenseKind.cls_layers`).
        """
        return DENSE.cls_layers(self)

    @property
    def recording_targets(self) -> bool:
        """Whether a loss inside :meth:`loss` records its assignment for
        LoMa (:meth:`record_targets`)."""
        return self._targets_record is not None

    def forward(self,
                feats: Tuple[Tensor, ...],
                cali_vectors: Optional[Tensor] = None) -> tuple:
        """The wrapped head's forward with calibrated classification.

        Args:
            feats (tuple[Tensor]): the levels' features.
            cali_vectors (Tensor, optional): V'; defaults to the one of
                :meth:`calibrated`, else the flat prior E0's.

        Returns:
            tuple: the wrapped head's outputs; only the class scores depend
            on V'.
        """
        if cali_vectors is None:
            cali_vectors = self.current_cali_vectors(feats[0])
        convs = list(self.dense_cls_convs().values())
        for conv in convs:
            conv.cali_vectors, conv.rho = cali_vectors, self.rho
        try:
            return super().forward(feats)
        finally:
            for conv in convs:
                conv.cali_vectors = None

    def record_targets(self, cls_scores: Tensor, labels: Tensor) -> None:
        """Keep the assignment of a loss computed inside :meth:`loss`: the
        (B, N, C) logits of all locations and their (B, N) labels
        (background: K)."""
        if self._targets_record is not None:
            self._targets_record.append((cls_scores, labels))

    def loss(self, x: Tuple[Tensor], batch_data_samples: SampleList) -> dict:
        """The wrapped head's losses, plus LoMa on the positive locations.

        Args:
            x (tuple[Tensor]): the levels' features.
            batch_data_samples (list[DetDataSample]): the data samples.

        Returns:
            dict[str, Tensor]: the losses (``loss_loma`` added).
        """
        if self.loss_loma is None:
            return super().loss(x, batch_data_samples)
        self._targets_record = []
        try:
            losses = super().loss(x, batch_data_samples)
            record = self._targets_record
        finally:
            self._targets_record = None
        if len(record) != 1:
            raise RuntimeError(
                f'LoMa needs the one assignment of the loss, got '
                f'{len(record)}: {type(self).__name__}.get_targets must '
                'call record_targets once')
        cls_scores, labels = record[0]
        losses['loss_loma'] = self.matched_class_loma(
            cls_scores, labels, self.current_priors(cls_scores),
            self.get_sample_priors(batch_data_samples, cls_scores))
        return losses
