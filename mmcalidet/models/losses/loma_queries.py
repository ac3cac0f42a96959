# Copyright (c) mmcalidet contributors. All rights reserved.
"""Which queries LoMa acts on, and LoMa for every decoder layer of a
calibrated head (paper Sec. 3.2).

The paper defines LoMa per logit and does not say how queries combine.
:class:`LoMaQueriesMixin` gives the head the two reductions
(``loma_queries``): every class logit of every matching query, or only the
matched class of each query the Hungarian matcher assigned, reusing the
matching of the head's own DETR losses.
"""
import contextlib
from typing import Callable, Dict, Iterator, List, Optional

import torch
from mmdet.structures import SampleList
from torch import Tensor

from .loma_head import LoMaMixin


class LoMaQueriesMixin(LoMaMixin):
    """LoMa on a DETR-family head's matching queries: the query selection
    and one ``LoMaLoss`` term per decoder layer (the loss and E_x of every
    image: :class:`LoMaMixin`).

    A base of :class:`~mmcalidet.models.dense_heads.CalibratedClsMixin`;
    the head's ``get_targets`` records the Hungarian matching for
    ``loma_queries='matched_class'``.

    Args:
        loss_loma (dict, optional): config of the :class:`LoMaLoss` applied
            to every decoder layer (:class:`LoMaMixin`).
        loma_queries (str): which logits LoMa manipulates and how its
            per-query terms are reduced (both reductions are ours).
            ``'all'``: every class logit of every matching (non-denoising)
            query, averaged over the B x Q matching queries of the batch.
            ``'matched_class'``: only the logit of the ground-truth class of
            each query the Hungarian matcher assigned (the matching of the
            decoder layer's own DETR losses), averaged over those queries
            (an accurate prior raises the right class, without raising
            present classes on background queries). Either way every decoder
            layer gets the full gamma. Defaults to ``'all'``.
    """

    LOMA_QUERIES = ('all', 'matched_class')

    def __init__(self, *args, loma_queries: str = 'all', **kwargs) -> None:
        if loma_queries not in self.LOMA_QUERIES:
            raise ValueError(f'loma_queries must be one of '
                             f'{self.LOMA_QUERIES}, got {loma_queries!r}')
        super().__init__(*args, **kwargs)
        self.loma_queries = loma_queries
        # see matching_record(): set only while a loss records the matching
        self._matching_record: Optional[Dict[tuple, Tensor]] = None

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

    def loss_loma_by_feat(
            self,
            all_layers_cls_scores: Tensor,
            priors: Tensor,
            sample_priors: Tensor,
            labels: Optional[List[Tensor]] = None) -> Dict[str, Tensor]:
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
        if self.loma_queries == 'matched_class' and (
                labels is None or len(labels) != num_layers):
            raise ValueError('LoMa on matched queries needs the target '
                             'labels of every decoder layer')
        for layer_id, cls_scores in enumerate(all_layers_cls_scores):
            key = 'loss_loma' if layer_id == num_layers - 1 \
                else f'd{layer_id}.loss_loma'
            if self.loma_queries == 'all':
                losses[key] = self.loss_loma(cls_scores, priors, sample_priors)
            else:
                losses[key] = self.matched_class_loma(cls_scores,
                                                      labels[layer_id], priors,
                                                      sample_priors)
        return losses
