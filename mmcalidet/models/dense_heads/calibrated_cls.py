# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrated classification shared by the CaliDet heads.

Every decoder-layer classification branch computes
``(W + rho * V')^T h + b = (W^T h + b) + rho * V'^T h`` where ``V'`` comes
from one CaliFormer shared by all decoder layers. The mixin adds the second
term to the logits of the wrapped DETR head, so the head's own layers,
box branches and the encoder's proposal branch stay untouched.
"""
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmdet.structures import SampleList
from mmdet.utils import InstanceList
from torch import Tensor

from ..head_kinds.decoder import decoder_cls_branch, decoder_cls_branches
from ..losses.loma_queries import LoMaQueriesMixin
from ..non_finite import check_finite_tensors
from .califormer_head import CaliFormerHeadMixin


class CalibratedClsMixin(LoMaQueriesMixin, CaliFormerHeadMixin):
    """Mixin for DETR-family heads with a calibrated classification branch.

    Put it before the head class: ``class CaliXHead(CalibratedClsMixin,
    XHead)``. The wrapped head's ``forward(hidden_states, references)``
    must return ``(all_layers_cls_scores, all_layers_bbox_preds)`` with the
    decoder layers first, as mmdet's ``DeformableDETRHead`` and
    ``DABDETRHead`` do. LoMa and its query selection are
    :class:`~mmcalidet.models.losses.LoMaQueriesMixin`; the CaliFormer
    and rho :class:`CaliFormerHeadMixin`.

    Args:
        califormer (dict): config of the :class:`CaliFormer`;
            ``num_classes`` and ``embed_dims`` default to the head's.
            Defaults to ``dict(type='CaliFormer')``.
        rho (float): the scale of the calibration vectors. Defaults to 0.2.
        loss_loma (dict, optional): see :class:`LoMaQueriesMixin`.
        loma_queries (str): see :class:`LoMaQueriesMixin`.
    """

    #: the head kind (:mod:`mmcalidet.models.head_kinds`)
    head_kind = 'decoder'

    def decoder_cls_branches(self) -> Dict[str, torch.nn.Module]:
        """The decoder layers' classification branches by name in the head
        (:func:`~mmcalidet.models.head_kinds.decoder.
        decoder_cls_branches`): one per layer, without the encoder's
        proposal classifier that two-stage heads (DINO, two-stage
        Deformable DETR) append (it stays uncalibrated); one alone where
        the layers share it (DETR, Conditional DETR, DAB-DETR)."""
        return decoder_cls_branches(self)

    def decoder_cls_branch(self, layer: int = -1) -> torch.nn.Module:
        """The classification branch (its ``weight`` is W) of a decoder
        ``layer`` (negative: from the last); the shared one for every
        layer of heads that have one (:meth:`decoder_cls_branches`)."""
        return decoder_cls_branch(self, layer)

    def calibrate_cls_scores(self, all_layers_cls_scores: Tensor,
                             hidden_states: Tensor,
                             cali_vectors: Tensor) -> Tensor:
        """Add ``rho * V'^T h`` to the logits of every decoder layer.

        Args:
            all_layers_cls_scores (Tensor): ``W^T h + b``, (L, B, Q, C) with
                C = K (sigmoid) or K + 1 (softmax with background).
            hidden_states (Tensor): h, (L, B, Q, d).
            cali_vectors (Tensor): V', (K, d) shared by the batch or
                (B, K, d) per sample.

        Returns:
            Tensor: calibrated logits, (L, B, Q, C).
        """
        if cali_vectors.dim() == 2:
            shift = torch.matmul(hidden_states, cali_vectors.t())
        elif cali_vectors.dim() == 3 and \
                cali_vectors.shape[0] == hidden_states.shape[1]:
            shift = torch.einsum('lbqd,bkd->lbqk', hidden_states, cali_vectors)
        else:
            raise ValueError(
                'cali_vectors must be (K, d) or (B, K, d) with B = '
                f'{hidden_states.shape[1]}, got {tuple(cali_vectors.shape)}')
        pad = all_layers_cls_scores.shape[-1] - shift.shape[-1]
        if pad:  # a background logit stays uncalibrated
            shift = torch.nn.functional.pad(shift, (0, pad))
        return all_layers_cls_scores + self.rho * shift.to(
            all_layers_cls_scores.dtype)

    def forward(self,
                hidden_states: Tensor,
                references: List[Tensor],
                cali_vectors: Optional[Tensor] = None) -> tuple:
        """The wrapped head's forward with calibrated logits.

        Args:
            hidden_states (Tensor): (L, B, Q, d) decoder outputs.
            references (list[Tensor]): the decoder references.
            cali_vectors (Tensor, optional): V', (K, d) or (B, K, d).
                ``None`` uses the flat prior E0 ("no prior").

        Returns:
            tuple[Tensor]: ``(all_layers_cls_scores, all_layers_bbox_preds)``
            as the wrapped head; only the logits depend on V'.
        """
        if cali_vectors is None:
            cali_vectors = self.get_cali_vectors(
                self.flat_priors(hidden_states))
        all_layers_cls_scores, all_layers_bbox_preds = super().forward(
            hidden_states, references)
        all_layers_cls_scores = self.calibrate_cls_scores(
            all_layers_cls_scores, hidden_states, cali_vectors)
        return all_layers_cls_scores, all_layers_bbox_preds

    def calibrated_loss(
        self,
        hidden_states: Tensor,
        references: List[Tensor],
        enc_outputs_class: Optional[Tensor],
        enc_outputs_coord: Optional[Tensor],
        batch_data_samples: SampleList,
        cali_vectors: Optional[Tensor],
        priors: Optional[Tensor],
        extra_feat_args: Tuple = (),
        matching_scores: Optional[Callable[..., Tensor]] = None
    ) -> Dict[str, Tensor]:
        """The wrapped head's ``loss_by_feat`` on the calibrated logits,
        plus LoMa: the body of each calibrated DETR head's ``loss``.

        Args:
            hidden_states (Tensor): (L, B, Q, d) decoder outputs.
            references (list[Tensor]): the decoder references.
            enc_outputs_class (Tensor, optional): encoder proposal logits.
            enc_outputs_coord (Tensor, optional): encoder proposal boxes.
            batch_data_samples (list[DetDataSample]): the data samples.
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors (B, K, K) or
                (K, K); with ``cali_vectors`` also ``None``, E0.
            extra_feat_args (tuple): what ``loss_by_feat`` takes after the
                image metas (DINO's ``dn_meta``).
            matching_scores (callable, optional): the matching queries'
                logits from the head outputs; ``None``: all queries.

        Returns:
            dict[str, Tensor]: the loss components.
        """
        cali_vectors, priors = self.resolve_priors(hidden_states, cali_vectors,
                                                   priors)
        batch_gt_instances = [ds.gt_instances for ds in batch_data_samples]
        batch_img_metas = [ds.metainfo for ds in batch_data_samples]

        outs = self(hidden_states, references, cali_vectors)
        self.check_finite_outputs(*outs, hidden_states, cali_vectors,
                                  enc_outputs_class, enc_outputs_coord)
        scores = outs[0] if matching_scores is None else matching_scores(*outs)
        return self.loss_with_loma(
            partial(self.loss_by_feat, *outs, enc_outputs_class,
                    enc_outputs_coord, batch_gt_instances, batch_img_metas,
                    *extra_feat_args), scores, priors, batch_data_samples,
            hidden_states)

    def check_finite_outputs(
            self,
            all_layers_cls_scores: Tensor,
            all_layers_bbox_preds: Tensor,
            hidden_states: Tensor,
            cali_vectors: Tensor,
            enc_outputs_class: Optional[Tensor] = None,
            enc_outputs_coord: Optional[Tensor] = None) -> None:
        """Raise :class:`~mmcalidet.models.non_finite.NonFiniteError`
        if what the Hungarian matcher is given holds NaN or inf (scipy would
        fail with ``matrix contains invalid numeric entries``).

        The error names the iteration, the decoder layers (and encoder
        proposals) whose logits or boxes are not finite, and whether the
        decoder hidden states and V' are.

        Args:
            all_layers_cls_scores (Tensor): calibrated logits (L, B, Q, C).
            all_layers_bbox_preds (Tensor): boxes (L, B, Q, 4).
            hidden_states (Tensor): h, (L, B, Q, d).
            cali_vectors (Tensor): V'.
            enc_outputs_class (Tensor, optional): encoder proposal logits.
            enc_outputs_coord (Tensor, optional): encoder proposal boxes.
        """
        named = []
        for layer_id, (scores, boxes) in enumerate(
                zip(all_layers_cls_scores, all_layers_bbox_preds)):
            named += [(f'decoder layer {layer_id} logits', scores),
                      (f'decoder layer {layer_id} boxes', boxes)]
        named += [('encoder proposal logits', enc_outputs_class),
                  ('encoder proposal boxes', enc_outputs_coord)]
        check_finite_tensors(
            'head outputs',
            named, [('decoder hidden states', hidden_states),
                    ("V' (CaliFormer output)", cali_vectors)],
            when='before the Hungarian matching')

    def predict(self,
                hidden_states: Tensor,
                references: List[Tensor],
                batch_data_samples: SampleList,
                rescale: bool = True,
                cali_vectors: Optional[Tensor] = None) -> InstanceList:
        """Forward with V' and post-process, as the wrapped head's predict.

        Args:
            hidden_states (Tensor): (L, B, Q, d) decoder outputs.
            references (list[Tensor]): the decoder references.
            batch_data_samples (list[DetDataSample]): the data samples.
            rescale (bool): rescale boxes to the original image size.
            cali_vectors (Tensor, optional): V' (see :meth:`forward`).

        Returns:
            list[InstanceData]: detections per image.
        """
        batch_img_metas = [
            data_sample.metainfo for data_sample in batch_data_samples
        ]
        outs = self(hidden_states, references, cali_vectors)
        return self.predict_by_feat(
            *outs, batch_img_metas=batch_img_metas, rescale=rescale)
