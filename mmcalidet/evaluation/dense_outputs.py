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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.structures import InstanceData
from torch import Tensor, nn

from ..models.head_kinds import DENSE, kind_of_head


class DenseHeadOutputs:
    """Per cached image, a dense head's outputs with V' = 0 and, for a
    CaliDet head, its classification convs' inputs.

    Args:
        head (nn.Module): the detector's ``bbox_head``: a calibrated dense
            head (``head_kind = 'dense'``) or a plain one whose ``forward``
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
        self.calibratable = kind_of_head(head) is DENSE
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
        k, d = self.head.num_classes, self.head.calibrated_feature_dims()
        with DENSE.recording_calls(self.head) as calls:
            outs = tuple(
                self.head(feats, cali_vectors=feats[0].new_zeros(k, d)))
        scores = outs[0]
        if len(calls) != len(scores) or any(
                out is not score for (_, out), score in zip(calls, scores)):
            raise TypeError(
                f'{type(self.head).__name__}: its class scores are not its '
                'classification convs\' outputs, level by level; '
                'DenseHeadOutputs cannot add V\' to them')
        return outs, [x for x, _ in calls]

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
        convs = DENSE.level_convs(self.head)
        out = []
        for conv, score, x in zip(convs, scores, inputs):
            deltas = self.head.rho * conv.channel_deltas(
                cali_vectors.to(x.dtype))
            pattern = 'bdhw,cd->bchw' if deltas.dim() == 2 else \
                'bdhw,bcd->bchw'
            out.append(score + torch.einsum(pattern, x, deltas))
        return out

    @classmethod
    def for_model(cls, model: nn.Module) -> 'DenseHeadOutputs':
        """The outputs of a one-stage detector's ``bbox_head``."""
        return cls(model.bbox_head)

    def predict(self, rescorer, idx: np.ndarray,
                prior: Optional[Tensor]) -> List[InstanceData]:
        """The detections of a batch of cached images, as the detector's
        ``predict`` gives them: the kept outputs, the class scores under
        V' (a CaliDet head) or corrected (a plain head's post-hoc
        correction), then the head's ``predict_by_feat``.

        Args:
            rescorer (HeadRescorer): the re-scorer (its model, cache,
                device and correction).
            idx (np.ndarray): the images' cache indices (one feature
                size).
            prior (Tensor, optional): V' of a CaliDet detector, (K, d) or
                (B, K, d); a plain detector's prior for its correction,
                (K, K) or (B, K, K), or ``None``.

        Returns:
            list[InstanceData]: per image ``bboxes``, ``scores``,
            ``labels`` (original image coordinates).
        """
        cache = rescorer.cache
        outs, inputs = self.get(idx,
                                lambda: cache.get(idx, rescorer.device)[0])
        if rescorer.calibratable:
            outs[0] = self.calibrated_scores(outs[0], inputs, prior)
        elif rescorer.correction is not None:
            if prior is None:
                raise ValueError('a post-hoc correction needs a prior')
            outs[0] = corrected_levels(outs[0], prior, rescorer.correction)
        elif prior is not None:
            raise ValueError(f'{type(rescorer.model).__name__} takes no '
                             'prior; pass a post-hoc correction to use one')
        return self.head.predict_by_feat(
            *outs,
            batch_img_metas=[cache.data_samples[int(k)].metainfo for k in idx],
            rescale=True)


def corrected_levels(levels: List[Tensor], priors: Tensor,
                     correction: Callable) -> List[Tensor]:
    """A post-hoc correction of a dense head's class logits: the levels'
    (B, K, H, W) maps as one (B, locations, K) tensor (the class evidence
    a correction reads), corrected, split back.

    Args:
        levels (list[Tensor]): per level, (B, K, H, W) logits.
        priors (Tensor): (K, K) or (B, K, K).
        correction (callable): ``correction(logits, priors) -> logits``.

    Returns:
        list[Tensor]: the corrected levels, shaped as given.
    """
    flat = [x.flatten(2).transpose(1, 2) for x in levels]
    sizes = [x.shape[1] for x in flat]
    fixed = correction(torch.cat(flat, dim=1), priors)
    return [
        part.transpose(1, 2).reshape(level.shape)
        for part, level in zip(fixed.split(sizes, dim=1), levels)
    ]
