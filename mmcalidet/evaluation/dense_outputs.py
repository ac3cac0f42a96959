# Copyright (c) mmcalidet contributors. All rights reserved.
"""A one-stage head's prior-independent outputs, computed once per image.

Under a prior, only a dense head's class logits change. The towers, the
box branch and the classification conv's input x do not. For a CaliDet
head (``CalibratedDenseClsMixin``), each level's logits under V' are the
logits with V' = 0 plus ``rho * V'^T x`` at every location (the conv adds
``rho * V'`` to its kernel's centre). A plain head's outputs do not depend
on the prior at all; a post-hoc correction acts on its logits.

:class:`DenseHeadOutputs` runs the head once per cached image and keeps
its outputs (and, for a CaliDet head, x per level). Re-scoring under
another prior then costs the calibration term and the post-processing,
not the towers: :class:`~mmcalidet.evaluation.HeadRescorer` uses it for
one-stage detectors.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn


class DenseHeadOutputs:
    """Per cached image, a dense head's outputs with V' = 0 and, for a
    CaliDet head, its classification convs' inputs.

    Args:
        head (nn.Module): the detector's ``bbox_head``: a calibrated dense
            head (``dense_cls_convs``) or a plain one whose ``forward``
            returns lists of per-level tensors, class scores first
            (mmdet's dense heads).

    Memory: what the head outputs plus, for a CaliDet head, the
    classification convs' input (``feat_channels`` per location), per
    image; ``nbytes`` says how much. What is kept is the head's output for
    its weights at the first scoring, as a ``FeatureCache`` holds the
    trunk's: a head trained further needs a new one (the CaliFormer and
    ``rho`` are read at each scoring).
    """

    def __init__(self, head: nn.Module) -> None:
        self.head = head
        self.calibratable = hasattr(head, 'dense_cls_convs')
        # cache index -> (outputs per level, conv inputs per level)
        self._kept: Dict[int, Tuple[Tuple[Tuple[Tensor, ...], ...],
                                    Tuple[Tensor, ...]]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of everything kept."""
        return sum(x.numel() * x.element_size()
                   for outs, inputs in self._kept.values()
                   for x in [t for level in outs
                             for t in level] + list(inputs))

    def _run(self, feats: Tuple[Tensor, ...]) -> Tuple[tuple, List[Tensor]]:
        """The head's outputs on a batch (V' = 0 for a CaliDet head) and
        the classification convs' inputs, in level order."""
        if not self.calibratable:
            return tuple(self.head(feats)), []
        convs = list(self.head.dense_cls_convs().values())
        seen: Dict[int, Tuple[Tensor, Tensor]] = {}

        def keep(level: int):

            def hook(conv, args, out):
                seen[level] = (args[0], out)

            return hook

        hooks = [
            conv.register_forward_hook(keep(i)) for i, conv in enumerate(convs)
        ]
        k, d = self.head.num_classes, self.head.calibrated_feature_dims()
        try:
            outs = tuple(
                self.head(feats, cali_vectors=feats[0].new_zeros(k, d)))
        finally:
            for hook in hooks:
                hook.remove()
        scores = outs[0]
        if len(seen) != len(convs) or len(scores) != len(convs) or any(
                seen[i][1] is not scores[i] for i in range(len(convs))):
            raise TypeError(
                f'{type(self.head).__name__}: its class scores are not its '
                'classification convs\' outputs, level by level; '
                'DenseHeadOutputs cannot add V\' to them')
        return outs, [seen[i][0] for i in range(len(convs))]

    def get(self, indices: Sequence[int], feats) -> Tuple[List, List[Tensor]]:
        """The outputs of a batch of cached images, run once and kept.

        Args:
            indices (Sequence[int]): their cache indices (images of one
                feature size, as :meth:`FeatureCache.batches` groups them).
            feats (callable): ``feats() -> tuple[Tensor]``, the batch's
                levels' features, called only when an image was not kept.

        Returns:
            tuple: the head's outputs (a list per output, of (B, ...)
            tensors per level) and the conv inputs per level (empty for a
            plain head).
        """
        idx = [int(k) for k in np.asarray(indices).reshape(-1)]
        if any(k not in self._kept for k in idx):
            outs, inputs = self._run(feats())
            for i, k in enumerate(idx):
                self._kept[k] = (tuple(
                    tuple(level[i] for level in out)
                    for out in outs), tuple(x[i] for x in inputs))
        kept = [self._kept[k] for k in idx]
        outs = [[
            torch.stack([img[0][o][level] for img in kept])
            for level in range(len(kept[0][0][o]))
        ] for o in range(len(kept[0][0]))]
        inputs = [
            torch.stack([img[1][level] for img in kept])
            for level in range(len(kept[0][1]))
        ]
        return outs, inputs

    def calibrated_scores(self, scores: List[Tensor], inputs: List[Tensor],
                          cali_vectors: Tensor) -> List[Tensor]:
        """The class scores under V': the kept (V' = 0) scores plus
        ``rho * V'^T x`` per level, as the head's calibrated convs give.

        Args:
            scores (list[Tensor]): per level, (B, C_out, H, W) with V' = 0.
            inputs (list[Tensor]): per level, the convs' (B, d, H, W) input.
            cali_vectors (Tensor): V', (K, d) shared or (B, K, d).

        Returns:
            list[Tensor]: per level, the (B, C_out, H, W) scores.
        """
        convs = list(self.head.dense_cls_convs().values())
        out = []
        for conv, score, x in zip(convs, scores, inputs):
            deltas = self.head.rho * conv.channel_deltas(
                cali_vectors.to(x.dtype))
            pattern = 'bdhw,cd->bchw' if deltas.dim() == 2 else \
                'bdhw,bcd->bchw'
            out.append(score + torch.einsum(pattern, x, deltas))
        return out


def has_dense_head(model: nn.Module) -> bool:
    """Whether ``model`` predicts with one dense head on its features (a
    ``bbox_head`` with ``predict_by_feat``, no RoI head, no decoder)."""
    head = getattr(model, 'bbox_head', None)
    return (head is not None and hasattr(head, 'predict_by_feat')
            and not hasattr(model, 'roi_head')
            and not hasattr(model, 'decoder'))
