# Copyright (c) mmcalidet contributors. All rights reserved.
"""The decoder kind: a DETR-family head, whose decoder layers each classify
their queries with a linear branch (mmdet's ``cls_branches``, one per
decoder layer, or one ``fc_cls`` the layers share).

The encoder's proposal classifier that two-stage heads (DINO, two-stage
Deformable DETR) append to the branches stays uncalibrated: it is not a
decoder layer's. A cache of this kind holds every decoder layer's hidden
states and boxes (:mod:`mmcalidet.decoder_cache.build`); the calibrator's
loss classifies them (:func:`cached_head_losses`).
"""
from functools import partial
from typing import Dict, List

import torch
from mmdet.models.dense_heads import DETRHead
from mmdet.structures import SampleList
from torch import Tensor, nn

from .base import HeadKind, register_head_kind


def decoder_cls_branches(head: nn.Module) -> Dict[str, nn.Module]:
    """The decoder layers' classification branches of a DETR head (plain or
    calibrated) by name in the head: ``cls_branches.<i>`` per layer,
    without the encoder's proposal classifier of a two-stage head;
    ``fc_cls`` alone where the layers share it (DETR, Conditional DETR,
    DAB-DETR).

    Args:
        head (nn.Module): a DETR-family head.

    Returns:
        dict[str, nn.Module]: the branches, in layer order.
    """
    branches = getattr(head, 'cls_branches', None)
    if branches is None:
        return {'fc_cls': head.fc_cls}
    num = len(branches) - int(bool(getattr(head, 'as_two_stage', False)))
    return {f'cls_branches.{i}': branches[i] for i in range(num)}


def decoder_cls_branch(head: nn.Module, layer: int = -1) -> nn.Module:
    """The classification branch (its ``weight`` is W) of a decoder
    ``layer`` (negative: from the last); the shared one for every layer of
    heads that share it.

    Raises:
        IndexError: no such decoder layer.
    """
    layers = list(decoder_cls_branches(head).values())
    if len(layers) == 1 and getattr(head, 'cls_branches', None) is None:
        return layers[0]
    if not -len(layers) <= layer < len(layers):
        raise IndexError(f'decoder layer {layer} out of range for '
                         f'{len(layers)} decoder layers')
    return layers[layer]


def unique_modules(modules) -> List[nn.Module]:
    """``modules`` each once (a head that shares one branch across its
    layers, ``share_pred_layer``, lists it once)."""
    found: Dict[int, nn.Module] = {}
    for module in modules:
        found.setdefault(id(module), module)
    return list(found.values())


def cached_head_losses(head: nn.Module,
                       hidden_states: Tensor,
                       bbox_preds: Tensor,
                       batch_data_samples: SampleList,
                       cali_vectors: Tensor,
                       priors: Tensor,
                       train_cls_branches: bool = False) -> Dict[str, Tensor]:
    """The training losses of a calibrated head's matching queries from
    cached decoder outputs: each decoder layer's classification ``(W + rho
    V')^T h + b``, Hungarian matching against the ground truth, the focal
    and box losses of mmdet's ``DETRHead.loss_by_feat`` and LoMa.

    What differs from the head's ``loss`` on images: no denoising queries
    and no encoder proposal loss (neither depends on the prior), and the
    boxes are the cached ones (their losses are constants that only enter
    the matching and the log).

    Args:
        head (nn.Module): a calibrated head
            (:class:`~mmcalidet.models.dense_heads.CalibratedClsMixin`).
        hidden_states (Tensor): (L, B, Q, d) cached hidden states.
        bbox_preds (Tensor): (L, B, Q, 4) cached boxes (normalised cx, cy,
            w, h).
        batch_data_samples (list[DetDataSample]): with ``gt_instances``
            (and ``sample_prior`` from the EdgeSampler).
        cali_vectors (Tensor): V' of ``priors``, (B, K, d) or (K, d).
        priors (Tensor): the injected priors, (B, K, K) or (K, K).
        train_cls_branches (bool): let gradients reach ``W`` and ``b`` of
            the decoder layers' classification branches (otherwise only the
            CaliFormer learns).

    Returns:
        dict[str, Tensor]: ``loss_cls``, ``loss_bbox``, ``loss_iou``,
        ``loss_loma`` and their ``d{i}.`` versions for the other decoder
        layers.
    """
    with torch.set_grad_enabled(train_cls_branches
                                and torch.is_grad_enabled()):
        cls_scores = torch.stack([
            decoder_cls_branch(head, layer)(h)
            for layer, h in enumerate(hidden_states)
        ])
    cls_scores = head.calibrate_cls_scores(cls_scores, hidden_states,
                                           cali_vectors)
    head.check_finite_outputs(cls_scores, bbox_preds, hidden_states,
                              cali_vectors)
    batch_gt_instances = [ds.gt_instances for ds in batch_data_samples]
    batch_img_metas = [ds.metainfo for ds in batch_data_samples]
    # the plain per-layer DETR losses (DINO's and Deformable DETR's
    # loss_by_feat add the denoising and encoder losses)
    return head.loss_with_loma(
        partial(DETRHead.loss_by_feat, head, cls_scores, bbox_preds,
                batch_gt_instances, batch_img_metas), cls_scores, priors,
        batch_data_samples, hidden_states)


class DecoderKind(HeadKind):
    """The adapter of DETR-family heads (see the module)."""
    name = 'decoder'
    export_name = 'detr'
    words = 'a DETR\'s decoder queries'
    cache_writer = 'mmcalidet.decoder_cache.decoder:fill_decoder_cache'
    rescorer = 'mmcalidet.evaluation.scoring:Rescorer'
    export_wrapper = 'mmcalidet.deploy.export_wrappers:ExportWrapper'
    export_outputs = ('dets', 'labels')

    def claims(self, model: nn.Module) -> bool:
        """A DETR-family detector (mmdet's ``DetectionTransformer``)."""
        from mmdet.models.detectors import DetectionTransformer
        return isinstance(model, DetectionTransformer)

    def cls_layers(self, head: nn.Module) -> Dict[str, nn.Module]:
        """The decoder layers' branches (:func:`decoder_cls_branches`)."""
        return decoder_cls_branches(head)

    def layer_logits(self, head: nn.Module, hidden: Tensor,
                     layer: int) -> Tensor:
        """The plain logits ``W_l^T h + b_l`` of decoder ``layer``'s
        hidden states (B, Q, d), as the head computes them before any
        calibration or correction."""
        return decoder_cls_branch(head, layer)(hidden)

    def feature_width(self, head: nn.Module) -> int:
        """d, the input width of the first layer's branch."""
        return int(decoder_cls_branch(head, 0).weight.shape[1])

    def class_weight(self, head: nn.Module) -> Tensor:
        """W of the last decoder layer's branch."""
        return decoder_cls_branch(head, -1).weight[:head.num_classes]

    def fold(self, head: nn.Module, cali_vectors: Tensor) -> None:
        """``W + rho V'`` in every decoder layer's branch (each once); the
        head then adds no calibration term."""
        num_classes = cali_vectors.shape[0]
        for branch in unique_modules(decoder_cls_branches(head).values()):
            branch.weight[:num_classes] += head.rho * cali_vectors.to(
                branch.weight.dtype)
        head.calibrate_cls_scores = \
            lambda scores, hidden, cali_vectors: scores

    def cached_losses(self, head: nn.Module, batch_inputs: Dict[str, Tensor],
                      batch_data_samples, cali_vectors: Tensor, priors: Tensor,
                      train_cls: bool) -> Dict[str, Tensor]:
        """:func:`cached_head_losses` of the cached hidden states and
        boxes."""
        return cached_head_losses(
            head,
            batch_inputs['hidden_states'],
            batch_inputs['bbox_preds'],
            batch_data_samples,
            cali_vectors,
            priors,
            train_cls_branches=train_cls)


#: the decoder kind's adapter
DECODER = register_head_kind(DecoderKind())
