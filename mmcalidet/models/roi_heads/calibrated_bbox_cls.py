# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrated classification for two-stage box heads.

A two-stage detector's box head classifies every RoI with a linear layer
(``fc_cls``, K + 1 softmax logits, the last one background). The mixin
swaps it for a :class:`CalibratedLinear` with the same parameters, so every
RoI's class logits are ``(W + rho * V') h + b`` with V' from the head's
CaliFormer; the background logit, the box branch and the post-processing
stay the wrapped head's.

The detector passes V' (and, in training, the injected priors) for the
length of a forward through :meth:`CalibratedBBoxClsMixin.calibrated`; the
RoI head passes the image index of every RoI (per-image V' becomes per-RoI
V') and, in training, the data samples (each image's E_x for LoMa). LoMa
acts on each sampled positive RoI's target class: its logit, or its softmax
probability (``loma_input='softmax'``: bounded, so that LoMa cannot trade
the softmax cross-entropy away).
"""
import contextlib
from typing import ContextManager, Iterator, List, Optional

import torch
from mmdet.structures import SampleList
from torch import Tensor

from ..dense_heads.califormer_head import CalibrationContextMixin
from ..layers import CalibratedLinear
from ..losses.loma_head import LoMaMixin


def pad_by_image(values: Tensor, images: Tensor, num_images: int,
                 fill: float) -> Tensor:
    """Group the rows of a batch's RoIs by image.

    Args:
        values (Tensor): (N, ...) one row per RoI.
        images (Tensor): (N,) the image index of every RoI.
        num_images (int): B.
        fill (float): the value of the padding rows.

    Returns:
        Tensor: (B, M, ...) with M the most RoIs of one image; image b's
        RoIs in their order, then padding.
    """
    images = images.long()
    counts = torch.bincount(images, minlength=num_images)
    most = int(counts.max()) if images.numel() else 0
    order = torch.argsort(images, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slots = torch.arange(len(images), device=images.device) - \
        starts[images[order]]
    padded = values.new_full((num_images, most, *values.shape[1:]), fill)
    return padded.index_put((images[order], slots), values[order])


class CalibratedBBoxClsMixin(LoMaMixin, CalibrationContextMixin):
    """Mixin for two-stage box heads with a calibrated ``fc_cls``.

    Put it before the head class: ``class CaliXBBoxHead(
    CalibratedBBoxClsMixin, XBBoxHead)``; the RoI head hands it the RoIs'
    image indices and the data samples (``CaliStandardRoIHead``).

    Args:
        califormer (dict): config of the :class:`CaliFormer`; its
            ``embed_dims`` defaults to ``fc_cls.in_features``.
        rho (float): the scale of V'. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss`, on
            the target class of the sampled positive RoIs; ``None``
            disables it.
        loma_input (str): what LoMa acts on: ``'logits'`` (the paper's,
            the default) or ``'softmax'`` (the K classes' softmax
            probabilities: bounded in [0, 1]).
    """

    #: the head kind (:mod:`mmcalidet.models.head_kinds`)
    head_kind = 'roi'
    #: the values :meth:`loma_inputs` can give LoMa
    LOMA_INPUTS = ('logits', 'softmax')

    def __init__(self, *args, loma_input: str = 'logits', **kwargs) -> None:
        if loma_input not in self.LOMA_INPUTS:
            raise ValueError(f'loma_input must be one of {self.LOMA_INPUTS}, '
                             f'got {loma_input!r}')
        super().__init__(*args, **kwargs)
        self.loma_input = loma_input
        self.fc_cls = CalibratedLinear.from_linear(self.fc_cls,
                                                   self.num_classes)
        # the RoIs' image indices set by roi_images(); the data samples by
        # loma_samples()
        self._roi_images: Optional[Tensor] = None
        self._loma_samples: Optional[SampleList] = None

    def calibrated_feature_dims(self) -> int:
        """d: the input width of ``fc_cls``."""
        if not getattr(self, 'with_cls', False):
            raise ValueError(f'{type(self).__name__} needs a classifier '
                             '(with_cls=True)')
        return self.fc_cls.in_features

    @contextlib.contextmanager
    def _setting(self, name: str, value) -> Iterator[None]:
        """Set the attribute ``name`` to ``value`` inside the block."""
        previous = getattr(self, name)
        setattr(self, name, value)
        try:
            yield
        finally:
            setattr(self, name, previous)

    def loma_inputs(self, cls_score: Tensor) -> Tensor:
        """What LoMa acts on (``loma_input``), from the (..., K + 1)
        logits: the K class logits, or their softmax probabilities."""
        if self.loma_input == 'softmax':
            cls_score = cls_score.softmax(-1)
        return cls_score[..., :self.num_classes]

    def roi_images(self, images: Tensor) -> ContextManager:
        """Inside the block, the forwards' RoIs belong to ``images``
        ((N,), ``rois[:, 0]``): image b's RoIs read V'_b."""
        return self._setting('_roi_images', images)

    def loma_samples(self, batch_data_samples: SampleList) -> ContextManager:
        """Inside the block, the losses are those of ``batch_data_samples``
        (their E_x for LoMa)."""
        return self._setting('_loma_samples', batch_data_samples)

    @contextlib.contextmanager
    def _calibrating(self, x: Tensor, cali_vectors: Optional[Tensor],
                     roi_images: Optional[Tensor]) -> Iterator[None]:
        """Inside the block, ``fc_cls`` calibrates its rows by V' (see
        :meth:`forward` for the arguments)."""
        if cali_vectors is None:
            cali_vectors = self.current_cali_vectors(x)
        if roi_images is None:
            roi_images = self._roi_images
        if cali_vectors.dim() == 3 and roi_images is None:
            raise ValueError("per-image V' (B, K, d) needs the image index "
                             'of every RoI (roi_images, rois[:, 0])')
        fc = self.fc_cls
        fc.cali_vectors, fc.rho = cali_vectors, self.rho
        fc.row_images = roi_images if cali_vectors.dim() == 3 else None
        try:
            yield
        finally:
            fc.cali_vectors = fc.row_images = None

    def forward(self,
                x: Tensor,
                cali_vectors: Optional[Tensor] = None,
                roi_images: Optional[Tensor] = None) -> tuple:
        """The wrapped head's forward with calibrated classification.

        Args:
            x (Tensor): the RoIs' features.
            cali_vectors (Tensor, optional): V', (K, d) or (B, K, d) per
                image; defaults to the one of :meth:`calibrated`, else the
                flat prior E0's.
            roi_images (Tensor, optional): (N,) the image index of every
                RoI, needed with per-image V'; defaults to the one of
                :meth:`roi_images`.

        Returns:
            tuple: the wrapped head's ``(cls_score, bbox_pred)``; only the
            first K columns of ``cls_score`` depend on V'.
        """
        with self._calibrating(x, cali_vectors, roi_images):
            return super().forward(x)

    def cls_score(self,
                  cls_features: Tensor,
                  cali_vectors: Optional[Tensor] = None,
                  roi_images: Optional[Tensor] = None) -> Tensor:
        """The calibrated ``fc_cls`` alone: the class logits of RoIs whose
        ``fc_cls`` input is ``cls_features`` (what :meth:`forward` scores
        them with, the rest of the head skipped).

        Args:
            cls_features (Tensor): (N, d) the inputs of ``fc_cls``.
            cali_vectors (Tensor, optional): as :meth:`forward`'s.
            roi_images (Tensor, optional): as :meth:`forward`'s.

        Returns:
            Tensor: (N, K + 1) logits.
        """
        with self._calibrating(cls_features, cali_vectors, roi_images):
            return self.fc_cls(cls_features)

    def loss_and_target(self, cls_score: Tensor, bbox_pred: Tensor,
                        rois: Tensor, sampling_results: List, *args,
                        **kwargs) -> dict:
        """The wrapped head's losses and targets, plus LoMa on the target
        class of the sampled positive RoIs (``loss_bbox['loss_loma']``).

        Args:
            cls_score (Tensor): (N, K + 1) logits of the sampled RoIs.
            bbox_pred (Tensor): their box deltas.
            rois (Tensor): (N, 5) the RoIs, image index first.
            sampling_results (list[SamplingResult]): one per image.
            *args, **kwargs: the rest of the wrapped head's arguments.

        Returns:
            dict: ``loss_bbox`` (the losses) and ``bbox_targets``.
        """
        out = super().loss_and_target(cls_score, bbox_pred, rois,
                                      sampling_results, *args, **kwargs)
        if self.loss_loma is not None:
            labels = out['bbox_targets'][0]
            if isinstance(labels, (list, tuple)):  # concat=False
                labels = torch.cat(labels)
            out['loss_bbox']['loss_loma'] = self.roi_loma(
                cls_score, labels, rois[:, 0], len(sampling_results))
        return out

    def roi_loma(self, cls_score: Tensor, labels: Tensor, images: Tensor,
                 num_images: int) -> Tensor:
        """LoMa on the logit of each positive RoI's target class, the RoIs
        grouped by image (background padding).

        Args:
            cls_score (Tensor): (N, C) logits, the first K the classes'.
            labels (Tensor): (N,) target labels (background: K).
            images (Tensor): (N,) the image index of every RoI.
            num_images (int): B.

        Returns:
            Tensor: the loss.
        """
        if self._loma_samples is None:
            raise RuntimeError(
                'LoMa needs the data samples of the batch (each image\'s '
                'E_x): compute the losses through a CaliStandardRoIHead')
        k = self.num_classes
        return self.matched_class_loma(
            pad_by_image(self.loma_inputs(cls_score), images, num_images,
                         0.0),
            pad_by_image(labels, images, num_images, k),
            self.current_priors(cls_score),
            self.get_sample_priors(self._loma_samples, cls_score))
