# Copyright (c) mmcalidet contributors. All rights reserved.
"""The dense kind: a one-stage head, whose classification conv (one per
level, or one the levels share) classifies every location.

A k x k conv with ``padding = k // 2`` is a linear classifier of each
location's k x k neighbourhood: a cache of this kind holds, per location,
the conv's input over its kernel (``d * k * k`` values, the conv's input
itself for k = 1), and ``W + rho V'`` adds ``rho V'`` to the kernel's
centre, the location's own feature. What differs between one-stage head
families (where the assigner's targets are, the classification loss) is a
:class:`DenseFamily` (:mod:`.rtmdet`, :mod:`.fcos`), registered in
:data:`DENSE_FAMILIES`.
"""
import contextlib
from typing import Dict, Iterator, List, Tuple

import torch
import torch.nn.functional as F
from mmdet.structures import SampleList
from torch import Tensor, nn

from ..layers.calibration_term import add_calibration
from .base import HeadKind, load_part, register_head_kind
from .decoder import unique_modules

#: family name -> the :class:`DenseFamily` of a kind of one-stage head
DENSE_FAMILIES: Dict[str, 'DenseFamily'] = {}


class DenseFamily:
    """What the dense kind needs of one family of one-stage heads beside
    its classification convs: where its loss's assignment is and its
    classification loss on cached locations.

    Attributes:
        name (str): the family.
        head_type (str): the mmdet head class it serves (and its
            subclasses, the calibrated head among them), by import path.
        cls_conv_name (str): the attribute holding the classification
            conv(s) of a plain head.
        score_factors (bool): the head's third output multiplies its
            scores after the top-k (mmdet's ``score_factors``).
    """
    name = ''
    head_type = ''
    cls_conv_name = 'conv_cls'
    score_factors = False

    def claims(self, head: nn.Module) -> bool:
        """Whether ``head`` is of this family."""
        return isinstance(head, load_part(self.head_type))

    def check(self, head: nn.Module) -> None:
        """Refuse a head of the family whose classification a cache
        cannot hold (raise ``TypeError``)."""

    def recording(self, head: nn.Module) -> Iterator[Dict[str, Tensor]]:
        """A context manager: inside it, the head's ``loss`` records its
        assignment: ``labels`` (background: K), ``weights`` (the label
        weights), ``scores`` (the quality targets, 1 where the loss has
        none) as (B, N) and ``boxes`` (B, N, 4: each location's box, x1 y1
        x2 y2 in the input's pixels), the levels' locations one after the
        other."""
        raise NotImplementedError

    def cls_loss(self, head: nn.Module, logits: Tensor, labels: Tensor,
                 scores: Tensor, weights: Tensor) -> Tensor:
        """The head's classification loss of cached locations.

        Args:
            head (nn.Module): the head.
            logits (Tensor): (B, Q, C) their logits.
            labels (Tensor): (B, Q) their labels (background: K).
            scores (Tensor): (B, Q) their quality targets.
            weights (Tensor): (B, Q) their loss weights (0: padding).

        Returns:
            Tensor: the loss, as the head's ``loss_cls`` on images.
        """
        raise NotImplementedError


def register_dense_family(family: DenseFamily) -> DenseFamily:
    """Register a one-stage head family under its ``name``."""
    if family.name in DENSE_FAMILIES:
        raise KeyError(f'dense family {family.name!r} is registered already')
    DENSE_FAMILIES[family.name] = family
    return family


def location_features(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """Each location's classification feature: the conv's (B, d, H, W)
    input over its kernel, (B, H * W, d * k * k) in the order of the
    conv's flattened weight (the input itself for k = 1)."""
    b, d = x.shape[:2]
    if tuple(conv.kernel_size) == (1, 1):
        return x.permute(0, 2, 3, 1).reshape(b, -1, d)
    cols = F.unfold(
        x, conv.kernel_size, dilation=conv.dilation, padding=conv.padding)
    return cols.transpose(1, 2)


def centre_features(conv: nn.Conv2d, hidden: Tensor) -> Tensor:
    """The locations' own features (the kernel's centre) of cached
    :func:`location_features`, (..., d)."""
    k = conv.kernel_size[0]
    if k == 1:
        return hidden
    centre = (k // 2) * k + k // 2
    return hidden.unflatten(-1, (-1, k * k))[..., centre]


def cached_level_logits(convs: List[nn.Conv2d], hidden: Tensor,
                        levels: Tensor) -> Tensor:
    """The plain logits ``W_l^T h + b_l`` of cached locations, each by the
    classification conv of its level.

    Args:
        convs (list[nn.Conv2d]): the head's per-level convs.
        hidden (Tensor): (B, Q, d * k * k) cached features.
        levels (Tensor): (B, Q) their levels (integers).

    Returns:
        Tensor: (B, Q, C) logits.
    """
    levels = levels.long()
    logits = hidden.new_zeros((*hidden.shape[:2], convs[0].out_channels))
    for k, conv in enumerate(convs):
        mask = levels == k
        out = F.linear(hidden[mask], conv.weight.flatten(1), conv.bias)
        logits = logits.index_put((mask, ), out)
    return logits


class DenseKind(HeadKind):
    """The adapter of one-stage dense heads (see the module)."""
    name = 'dense'
    export_name = 'dense'
    words = 'a one-stage head\'s locations'
    feature_cache = True
    cache_writer = 'mmcalidet.decoder_cache.dense:fill_dense_cache'
    rescorer = 'mmcalidet.evaluation.head_scoring:HeadRescorer'
    head_outputs = 'mmcalidet.evaluation.dense_outputs:DenseHeadOutputs'
    export_wrapper = 'mmcalidet.deploy.export_wrappers:DenseExportWrapper'
    export_outputs = ('boxes', 'scores')
    export_settings = 'mmcalidet.deploy.export_meta:dense_export_settings'

    def claims(self, model: nn.Module) -> bool:
        """A one-stage detector (mmdet's ``SingleStageDetector``) with a
        dense ``bbox_head``."""
        from mmdet.models.dense_heads.base_dense_head import BaseDenseHead
        from mmdet.models.detectors import SingleStageDetector
        return isinstance(model, SingleStageDetector) and isinstance(
            getattr(model, 'bbox_head', None), BaseDenseHead)

    def family(self, head: nn.Module) -> DenseFamily:
        """The head's :class:`DenseFamily`.

        Raises:
            TypeError: no registered family has the head.
        """
        for family in DENSE_FAMILIES.values():
            if family.claims(head):
                return family
        raise TypeError(
            f'{type(head).__name__} is not of a one-stage head family the '
            f'dense cache knows ({", ".join(DENSE_FAMILIES)})')

    def has_score_factors(self, head: nn.Module) -> bool:
        """Whether the head's scores are multiplied by a per-location
        factor after the top-k (its family's ``score_factors``: FCOS's
        centerness)."""
        family = next((f for f in DENSE_FAMILIES.values() if f.claims(head)),
                      None)
        return bool(family is not None and family.score_factors)

    def _convs(self, head: nn.Module):
        name = getattr(head, 'cls_conv_name', None) or \
            self.family(head).cls_conv_name
        return name, getattr(head, name)

    def cls_layers(self, head: nn.Module) -> Dict[str, nn.Module]:
        """The classification conv(s) by name: ``<name>`` where the levels
        share one, else ``<name>.<level>``."""
        name, convs = self._convs(head)
        if isinstance(convs, nn.Conv2d):
            return {name: convs}
        return {f'{name}.{i}': conv for i, conv in enumerate(convs)}

    def level_convs(self, head: nn.Module) -> List[nn.Conv2d]:
        """The classification conv of each level (a shared one repeated)."""
        convs = self._convs(head)[1]
        if isinstance(convs, nn.Conv2d):
            return [convs] * head.prior_generator.num_levels
        return list(convs)

    def check_cacheable(self, head: nn.Module) -> List[nn.Conv2d]:
        """The level convs of a head a dense cache can hold: a known
        family's, each conv square with one base prior's channels.

        Raises:
            TypeError: naming what does not fit.
        """
        self.family(head).check(head)
        convs = self.level_convs(head)
        for conv in convs:
            if conv.out_channels != head.cls_out_channels or \
                    tuple(conv.stride) != (1, 1) or \
                    conv.kernel_size[0] != conv.kernel_size[1] or \
                    conv.padding[0] != conv.kernel_size[0] // 2:
                raise TypeError(
                    'a dense cache holds one feature per location: the '
                    'classification convs must be square, keep the map '
                    f'size and have one base prior, got {conv}')
        return convs

    def feature_width(self, head: nn.Module) -> int:
        """``d * k * k``: a location's feature over the conv's kernel."""
        return int(self.level_convs(head)[0].weight[0].numel())

    def class_weight(self, head: nn.Module) -> Tensor:
        """W of the first level: its kernel's centre, the class rows."""
        conv = self.level_convs(head)[0]
        centre = conv.kernel_size[0] // 2
        return conv.weight[:head.num_classes, :, centre, centre]

    def fold(self, head: nn.Module, cali_vectors: Tensor) -> None:
        """``rho V'`` added to each conv's kernel centre; ``rho`` 0."""
        for conv in unique_modules(self.level_convs(head)):
            centre = conv.kernel_size[0] // 2
            conv.weight[:, :, centre, centre] += head.rho * \
                conv.channel_deltas(cali_vectors).to(conv.weight.dtype)
        head.rho = 0.0

    @contextlib.contextmanager
    def recording_calls(
            self, head: nn.Module) -> Iterator[List[Tuple[Tensor, Tensor]]]:
        """Inside the block, every call of the head's classification
        conv(s), ``(input, output)`` in call order (one per level of a
        forward)."""
        calls: List[Tuple[Tensor, Tensor]] = []
        hooks = [
            conv.register_forward_hook(lambda module, args, out: calls.append(
                (args[0], out)))
            for conv in unique_modules(self.level_convs(head))
        ]
        try:
            yield calls
        finally:
            for hook in hooks:
                hook.remove()

    def calibrated_logits(self,
                          head: nn.Module,
                          hidden: Tensor,
                          levels: Tensor,
                          cali_vectors: Tensor,
                          train_cls_convs: bool = False) -> Tensor:
        """``(W_l + rho V')^T h + b_l`` at cached locations, (B, Q, C).

        Args:
            head (nn.Module): a calibrated dense head.
            hidden (Tensor): (B, Q, d * k * k) cached features.
            levels (Tensor): (B, Q) their levels.
            cali_vectors (Tensor): V', (K, d) or (B, K, d).
            train_cls_convs (bool): let gradients reach ``W_l``, ``b_l``.
        """
        convs = self.level_convs(head)
        with torch.set_grad_enabled(train_cls_convs
                                    and torch.is_grad_enabled()):
            logits = cached_level_logits(convs, hidden, levels)
        deltas = convs[0].channel_deltas(cali_vectors.to(hidden.dtype))
        return add_calibration(logits, centre_features(convs[0], hidden),
                               deltas, head.rho)

    def cached_losses(self, head: nn.Module, batch_inputs: Dict[str, Tensor],
                      batch_data_samples: SampleList, cali_vectors: Tensor,
                      priors: Tensor, train_cls: bool) -> Dict[str, Tensor]:
        """The head's classification loss restricted to the cached
        locations (its family's :meth:`DenseFamily.cls_loss`) and LoMa on
        the positives' assigned class.

        ``targets`` (B, Q, 4) holds each location's level, label
        (K: background), quality target and weight.

        Returns:
            dict[str, Tensor]: ``loss_cls`` and, with LoMa, ``loss_loma``.
        """
        hidden = batch_inputs['hidden_states'][-1]
        levels, labels, scores, weights = batch_inputs['targets'].unbind(-1)
        logits = self.calibrated_logits(head, hidden, levels, cali_vectors,
                                        train_cls)
        k = head.num_classes
        labels = torch.where(weights > 0, labels.long(), k)
        losses = dict(
            loss_cls=self.family(head).cls_loss(head, logits, labels, scores,
                                                weights))
        if head.loss_loma is not None:
            losses['loss_loma'] = head.matched_class_loma(
                logits, labels, priors,
                head.get_sample_priors(batch_data_samples, logits))
        return losses


#: the dense kind's adapter
DENSE = register_head_kind(DenseKind())
