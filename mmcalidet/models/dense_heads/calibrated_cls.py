# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrated classification shared by the CaliDet heads.

Every decoder-layer classification branch computes
``(W + rho * V')^T h + b = (W^T h + b) + rho * V'^T h`` where ``V'`` comes
from one CaliFormer shared by all decoder layers. The mixin adds the second
term to the logits of the wrapped DETR head, so the head's own layers,
box branches and the encoder's proposal branch stay untouched.
"""
import contextlib
import copy
from functools import partial
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from mmdet.models.dense_heads import DETRHead
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.utils import ConfigType, InstanceList, OptConfigType
from torch import Tensor

from ...priors import label_lists_prior
from ..layers import flat_prior_like
from ..non_finite import check_finite_tensors


class CalibratedClsMixin:
    """Mixin for DETR-family heads with a calibrated classification branch.

    Put it before the head class: ``class CaliXHead(CalibratedClsMixin,
    XHead)``. The wrapped head's ``forward(hidden_states, references)``
    must return ``(all_layers_cls_scores, all_layers_bbox_preds)`` with the
    decoder layers first, as mmdet's ``DeformableDETRHead`` does.

    Args:
        califormer (dict): config of the :class:`CaliFormer`;
            ``num_classes`` and ``embed_dims`` default to the head's.
            Defaults to ``dict(type='CaliFormer')``.
        rho (float): the scale of the calibration vectors. Defaults to 0.2.
        loss_loma (dict, optional): config of the :class:`LoMaLoss` applied
            to every decoder layer; ``None`` disables it. Defaults to
            ``dict(type='LoMaLoss', loss_weight=20.0)``.
        loma_queries (str): which logits LoMa manipulates and how its
            per-query terms are reduced (the paper defines the term per
            logit and does not say how queries combine; both reductions
            are ours). ``'all'``: every class logit of every matching
            (non-denoising) query, averaged over the B x Q matching queries
            of the batch. ``'matched_class'``: only the logit of the
            ground-truth class of each query the Hungarian matcher assigned
            (the matching of the decoder layer's own DETR losses), averaged
            over those queries (an accurate prior raises the right class,
            without raising present classes on background queries). Either
            way every decoder layer gets the full gamma. Defaults to
            ``'all'``.
    """

    LOMA_QUERIES = ('all', 'matched_class')

    def __init__(self,
                 *args,
                 califormer: ConfigType = dict(type='CaliFormer'),
                 rho: float = 0.2,
                 loss_loma: OptConfigType = dict(
                     type='LoMaLoss', loss_weight=20.0),
                 loma_queries: str = 'all',
                 **kwargs) -> None:
        if loma_queries not in self.LOMA_QUERIES:
            raise ValueError(f'loma_queries must be one of '
                             f'{self.LOMA_QUERIES}, got {loma_queries!r}')
        super().__init__(*args, **kwargs)
        self.loma_queries = loma_queries
        # see matching_record(): set only while a loss records the matching
        self._matching_record: Optional[Dict[tuple, Tensor]] = None
        califormer = copy.deepcopy(califormer)
        califormer.setdefault('num_classes', self.num_classes)
        califormer.setdefault('embed_dims', self.embed_dims)
        if califormer['num_classes'] != self.num_classes or \
                califormer['embed_dims'] != self.embed_dims:
            raise ValueError(
                'califormer must have the head\'s num_classes and '
                f'embed_dims ({self.num_classes}, {self.embed_dims}), got '
                f'({califormer["num_classes"]}, {califormer["embed_dims"]})')
        self.califormer = MODELS.build(califormer)
        self.rho = rho
        self.loss_loma = MODELS.build(loss_loma) \
            if loss_loma is not None else None

    def init_weights(self) -> None:
        """Initialise the wrapped head, then the CaliFormer."""
        super().init_weights()
        self.califormer.init_weights()

    def decoder_cls_branch(self, layer: int = -1) -> torch.nn.Module:
        """The classification branch of a decoder layer.

        Two-stage heads (DINO, two-stage Deformable DETR) append the
        encoder's proposal classifier to ``cls_branches``; it is not a
        decoder layer's and stays uncalibrated.

        Args:
            layer (int): the decoder layer (negative: from the last).

        Returns:
            nn.Module: the branch (its ``weight`` is W of that layer).
        """
        num_layers = len(self.cls_branches) - int(
            bool(getattr(self, 'as_two_stage', False)))
        if not -num_layers <= layer < num_layers:
            raise IndexError(f'decoder layer {layer} out of range for '
                             f'{num_layers} decoder layers')
        return self.cls_branches[layer % num_layers]

    def flat_priors(self, like: Tensor) -> Tensor:
        """E0 (K x K) on the device of ``like``, the prior of "nothing is
        known"."""
        return flat_prior_like(
            like.new_empty((self.num_classes, self.num_classes)))

    def resolve_priors(
            self, hidden_states: Tensor, cali_vectors: Optional[Tensor],
            priors: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """The V' and priors a training loss uses: E0 when none is given,
        V' computed from the priors when not passed.

        Args:
            hidden_states (Tensor): decoder outputs (give dtype/device).
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors.

        Returns:
            tuple[Tensor, Tensor]: ``(cali_vectors, priors)``.
        """
        if priors is None:
            if cali_vectors is not None:
                raise ValueError('pass the priors that gave cali_vectors '
                                 '(LoMa needs them)')
            priors = self.flat_priors(hidden_states)
        if cali_vectors is None:
            cali_vectors = self.get_cali_vectors(priors)
        return cali_vectors, priors

    def get_cali_vectors(self,
                         priors: Tensor,
                         support: Optional[Tensor] = None,
                         marginals: Optional[Tensor] = None) -> Tensor:
        """V' for one prior (K x K -> K x d) or a batch (B x K x K ->
        B x K x d); ``support`` / ``marginals`` (experimental, see
        :class:`CaliFormer`) only when given."""
        if support is None and marginals is None:
            return self.califormer(priors)
        return self.califormer(priors, support=support, marginals=marginals)

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

    def check_finite_outputs(self,
                             all_layers_cls_scores: Tensor,
                             all_layers_bbox_preds: Tensor,
                             hidden_states: Tensor,
                             cali_vectors: Tensor,
                             enc_outputs_class: Optional[Tensor] = None,
                             enc_outputs_coord: Optional[Tensor] = None
                             ) -> None:
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

    @staticmethod
    def _predictions_key(cls_scores_list: List[Tensor]) -> tuple:
        """Identify the predictions a matching was made for: the memory
        and layout of the per-image logits (the views of one decoder
        layer's logits that mmdet's ``loss_by_feat_single`` passes)."""
        return tuple((s.data_ptr(), tuple(s.shape), s.stride())
                     for s in cls_scores_list)

    @contextlib.contextmanager
    def matching_record(self) -> Iterator[Dict[tuple, Tensor]]:
        """Record the Hungarian matching of the losses computed inside the
        block: the per-query labels (B, Q) of every ``get_targets`` call,
        keyed by the logits they were matched for.

        mmdet's ``loss_by_feat_single`` matches and computes the DETR
        losses in one method without returning the targets; recording them
        lets LoMa use the same matching, without a second one (a fifth of a
        cached calibrator step) and without copying mmdet's loss code. The
        record lives only inside the block and is looked up by the logits
        (:meth:`matched_labels`), not by the order of mmdet's calls.

        Yields:
            dict: the record (read it with :meth:`matched_labels`).
        """
        if self._matching_record is not None:
            raise RuntimeError('matching_record() blocks do not nest')
        self._matching_record = {}
        try:
            yield self._matching_record
        finally:
            self._matching_record = None

    def get_targets(self, cls_scores_list: List[Tensor], *args,
                    **kwargs) -> tuple:
        """The wrapped head's targets; inside :meth:`matching_record` the
        per-query labels are recorded for the logits they belong to."""
        targets = super().get_targets(cls_scores_list, *args, **kwargs)
        if self._matching_record is not None:
            self._matching_record[self._predictions_key(
                cls_scores_list)] = torch.stack(targets[0])
        return targets

    def matched_labels(self, record: Dict[tuple, Tensor],
                       all_layers_cls_scores: Tensor) -> List[Tensor]:
        """The recorded matching of each decoder layer.

        Args:
            record (dict): what :meth:`matching_record` recorded.
            all_layers_cls_scores (Tensor): (L, B, Q, C) the matching
                logits the losses were computed for.

        Returns:
            list[Tensor]: the (B, Q) labels of each layer (background =
            ``num_classes``).
        """
        labels = []
        for layer_id, cls_scores in enumerate(all_layers_cls_scores):
            key = self._predictions_key(list(cls_scores))
            if key not in record:
                raise RuntimeError(
                    f'no Hungarian matching was recorded for decoder layer '
                    f'{layer_id}: LoMa on matched queries needs the losses '
                    'to be computed for the same logits')
            labels.append(record[key])
        return labels

    def loss_with_loma(self, loss_by_feat: Callable[[], Dict[str, Tensor]],
                       all_layers_cls_scores: Tensor, priors: Tensor,
                       batch_data_samples: SampleList,
                       like: Tensor) -> Dict[str, Tensor]:
        """The wrapped head's losses plus LoMa of every decoder layer.

        Args:
            loss_by_feat (callable): computes the wrapped head's losses
                (e.g. ``partial(self.loss_by_feat, ...)``); for
                ``loma_queries='matched_class'`` its Hungarian matching is
                recorded and reused.
            all_layers_cls_scores (Tensor): (L, B, Q, C) calibrated logits
                of the matching queries, the tensor (or a same-layout view)
                that ``loss_by_feat`` computes the losses for.
            priors (Tensor): the injected priors, (B, K, K) or (K, K).
            batch_data_samples (list[DetDataSample]): give E_x.
            like (Tensor): gives the dtype and device of E_x.

        Returns:
            dict[str, Tensor]: the losses.
        """
        if self.loss_loma is None:
            return loss_by_feat()
        labels = None
        if self.loma_queries == 'all':
            losses = loss_by_feat()
        else:
            with self.matching_record() as record:
                losses = loss_by_feat()
            labels = self.matched_labels(record, all_layers_cls_scores)
        losses.update(
            self.loss_loma_by_feat(
                all_layers_cls_scores, priors,
                self.get_sample_priors(batch_data_samples, like), labels))
        return losses

    def loma_query_weights(self, all_layers_cls_scores: Tensor,
                           labels: Optional[List[Tensor]]) -> list:
        """Per layer ``(class_mask, avg_factor)`` for LoMa: ``(None,
        None)`` for every query and class (``'all'``); the one-hot matched
        class of assigned queries and their number (``'matched_class'``).

        Args:
            all_layers_cls_scores (Tensor): (L, B, Q, C) matching logits.
            labels (list[Tensor], optional): the (B, Q) target labels of
                each decoder layer (background = ``num_classes``).

        Returns:
            list[tuple]: one ``(class_mask, avg_factor)`` per layer.
        """
        num_layers = all_layers_cls_scores.shape[0]
        if self.loma_queries == 'all':
            return [(None, None)] * num_layers
        if labels is None or len(labels) != num_layers:
            raise ValueError('LoMa on matched queries needs the target '
                             'labels of every decoder layer')
        out = []
        k = self.num_classes
        for layer_labels in labels:
            pos = layer_labels < k
            mask = torch.zeros(
                (*layer_labels.shape, k),
                dtype=all_layers_cls_scores.dtype,
                device=all_layers_cls_scores.device)
            mask[pos] = torch.nn.functional.one_hot(
                layer_labels[pos], k).to(mask.dtype)
            out.append((mask, max(float(pos.sum()), 1.0)))
        return out

    def loss_loma_by_feat(self,
                          all_layers_cls_scores: Tensor,
                          priors: Tensor,
                          sample_priors: Tensor,
                          labels: Optional[List[Tensor]] = None
                          ) -> Dict[str, Tensor]:
        """LoMa for every decoder layer (``loss_loma`` for the last one,
        ``d{i}.loss_loma`` for the others, as mmdet names the DETR losses).

        Args:
            all_layers_cls_scores (Tensor): (L, B, Q, C) logits of the
                queries to average over (the matching queries).
            priors (Tensor): the injected priors, (B, K, K) or (K, K).
            sample_priors (Tensor): E_x, (B, K, K).
            labels (list[Tensor], optional): the (B, Q) target labels of
                each decoder layer (``loma_queries='matched_class'``).

        Returns:
            dict[str, Tensor]: the LoMa losses.
        """
        losses = {}
        num_layers = all_layers_cls_scores.shape[0]
        weights = self.loma_query_weights(all_layers_cls_scores, labels)
        for layer_id, cls_scores in enumerate(all_layers_cls_scores):
            key = 'loss_loma' if layer_id == num_layers - 1 \
                else f'd{layer_id}.loss_loma'
            mask, avg = weights[layer_id]
            if mask is None:
                losses[key] = self.loss_loma(cls_scores, priors,
                                             sample_priors)
            else:
                losses[key] = self.loss_loma(
                    cls_scores,
                    priors,
                    sample_priors,
                    class_mask=mask,
                    avg_factor=avg)
        return losses

    def loss_cached(self,
                    hidden_states: Tensor,
                    bbox_preds: Tensor,
                    batch_data_samples: SampleList,
                    cali_vectors: Tensor,
                    priors: Tensor,
                    train_cls_branches: bool = False) -> Dict[str, Tensor]:
        """The training losses of the matching queries from cached decoder
        outputs: each decoder layer's classification ``(W + rho V')^T h +
        b``, Hungarian matching against the ground truth, the focal and box
        losses of mmdet's ``DETRHead.loss_by_feat`` and LoMa.

        What differs from :meth:`loss` on images: no denoising queries and
        no encoder proposal loss (neither depends on the prior), and the
        boxes are the cached ones (their losses are constants that only
        enter the matching and the log).

        Args:
            hidden_states (Tensor): (L, B, Q, d) cached hidden states.
            bbox_preds (Tensor): (L, B, Q, 4) cached boxes (normalised
                cx, cy, w, h).
            batch_data_samples (list[DetDataSample]): with ``gt_instances``
                (and ``sample_prior`` from the EdgeSampler).
            cali_vectors (Tensor): V' of ``priors``, (B, K, d) or (K, d).
            priors (Tensor): the injected priors, (B, K, K) or (K, K).
            train_cls_branches (bool): let gradients reach ``W`` and ``b``
                of the decoder layers' classification branches (otherwise
                only the CaliFormer learns).

        Returns:
            dict[str, Tensor]: ``loss_cls``, ``loss_bbox``, ``loss_iou``,
            ``loss_loma`` and their ``d{i}.`` versions for the other
            decoder layers.
        """
        with torch.set_grad_enabled(train_cls_branches
                                    and torch.is_grad_enabled()):
            cls_scores = torch.stack([
                self.cls_branches[layer](h)
                for layer, h in enumerate(hidden_states)
            ])
        cls_scores = self.calibrate_cls_scores(cls_scores, hidden_states,
                                               cali_vectors)
        self.check_finite_outputs(cls_scores, bbox_preds, hidden_states,
                                  cali_vectors)
        batch_gt_instances = [ds.gt_instances for ds in batch_data_samples]
        batch_img_metas = [ds.metainfo for ds in batch_data_samples]
        # the plain per-layer DETR losses (DINO's and Deformable DETR's
        # loss_by_feat add the denoising and encoder losses)
        return self.loss_with_loma(
            partial(DETRHead.loss_by_feat, self, cls_scores, bbox_preds,
                    batch_gt_instances, batch_img_metas), cls_scores, priors,
            batch_data_samples, hidden_states)
