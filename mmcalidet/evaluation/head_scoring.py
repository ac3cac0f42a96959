# Copyright (c) mmcalidet contributors. All rights reserved.
"""Re-score a one- or two-stage CaliDet detector's cached features under
any prior.

:class:`HeadRescorer` is the :class:`~mmcalidet.evaluation.Rescorer` of
the detectors without a decoder (``CaliRTMDet``, ``CaliFasterRCNN``): from
a :class:`~mmcalidet.evaluation.FeatureCache` it reruns the detector's
prediction heads with V' of the prior, so the result equals
``model.predict`` under the same prior on the same batches: a two-stage
detector's RPN and box head once per image (its proposals, ``fc_cls``
inputs and box deltas are kept:
:class:`~mmcalidet.evaluation.roi_outputs.RoIHeadOutputs`), after which
a prior costs ``fc_cls`` and the post-processing; a one-stage
detector's dense head once per image, after which a prior costs the
calibration term and the post-processing
(:class:`~mmcalidet.evaluation.dense_outputs.DenseHeadOutputs`). It also
scores a plain one-stage detector (``RTMDet``, the baseline a
``CaliRTMDet`` is compared with): its dense head as ``model.predict`` runs
it, or with a post-hoc correction (:mod:`mmcalidet.evaluation.baselines`)
of every location's class logits; and a plain two-stage detector
(``FasterRCNN``), as ``model.predict`` runs it or with the marginal
re-weighting of its RoI head's softmax
(:mod:`mmcalidet.evaluation.roi_correction`).
Priors, memoisation and supports are the :class:`Rescorer`'s; only the
scoring step differs.
"""
import contextlib
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ..utils.progress import progress_bar
from .dense_outputs import DenseHeadOutputs, has_dense_head
from .feature_cache import FeatureCache, evaluating
from .roi_correction import check_softmax_correction, corrected_roi_scores
from .roi_outputs import RoIHeadOutputs
from .scoring import Rescorer


class HeadRescorer(Rescorer):
    """Predictions of a one- or two-stage CaliDet detector from a
    :class:`FeatureCache` under any prior (:meth:`Rescorer.predict`).

    Args:
        model (nn.Module): a calibratable one- or two-stage detector
            (``CalibratableSingleStageMixin`` /
            ``CalibratableTwoStageMixin``, e.g. ``CaliRTMDet``,
            ``CaliFasterRCNN``) or a plain one- or two-stage detector (e.g.
            ``RTMDet``, ``FasterRCNN``), the one that filled the cache.
        cache (FeatureCache): its features of the images.
        correction (callable, optional): a post-hoc correction
            ``correction(logits, priors) -> logits`` of a plain one-stage
            detector's class logits (B, locations, K), or one with a
            ``softmax_shift`` for a plain two-stage detector's RoI head;
            ``None`` for a CaliDet detector, which calibrates itself.
        batch_size (int): images per re-scoring step.

    The heads run in eval mode (the model's mode is restored after).
    """

    def __init__(self,
                 model: torch.nn.Module,
                 cache: FeatureCache,
                 correction: Optional[Callable] = None,
                 batch_size: int = 64) -> None:
        if not isinstance(cache, FeatureCache):
            raise TypeError('HeadRescorer re-scores a FeatureCache '
                            '(FeatureCache.from_batches(model, batches)), got '
                            f'{type(cache).__name__}')
        super().__init__(model, cache, correction, batch_size)
        #: a one-stage head's outputs, run once per image (two-stage: None)
        self._dense = DenseHeadOutputs(model.bbox_head) \
            if has_dense_head(model) else None
        #: a two-stage detector's box-head outputs, run once per image
        self._roi = RoIHeadOutputs(model.roi_head) \
            if hasattr(model, 'roi_head') else None
        #: a two-stage detector's RPN proposals per cache index
        self._proposals: Dict[int, InstanceData] = {}

    def _check_model(self, model: torch.nn.Module,
                     correction: Optional[Callable]) -> None:
        """Refuse all but a calibratable one- or two-stage detector or a
        plain one- or two-stage one, a post-hoc correction of a CaliDet
        detector, and one without a softmax form of a two-stage one."""
        supported = ('a calibratable one- or two-stage detector '
                     '(CalibratableSingleStageMixin or '
                     'CalibratableTwoStageMixin, e.g. CaliRTMDet, '
                     'CaliFasterRCNN) or a plain one- or two-stage detector '
                     '(e.g. RTMDet, FasterRCNN)')
        if self.calibratable and correction is not None:
            raise ValueError(
                'HeadRescorer takes no post-hoc correction of a CaliDet '
                'detector, which calibrates itself')
        if self.calibratable and hasattr(model, 'predict_from_feats'):
            return
        if not self.calibratable and is_plain_one_stage(model):
            return
        if not self.calibratable and is_plain_two_stage(model):
            if correction is not None:
                check_softmax_correction(correction, type(model).__name__)
            return
        raise TypeError(
            f'HeadRescorer scores {supported}; got {type(model).__name__} '
            '(a DETR-family detector: Rescorer on a DecoderCache)')

    def _vectors(self, priors: Optional[Tensor]) -> Tensor:
        """V' of a (K, K) prior or a (B, K, K) stack, with the supports
        registered; ``None``: the deployment prior's."""
        if priors is None:
            return self.model.deployment_cali_vectors()
        return self._cali_vectors(priors)

    def _predict(self, shared: Optional[Tensor], stack: Optional[Tensor],
                 fn: Optional[Callable], indices: np.ndarray,
                 progress: bool) -> List[InstanceData]:
        """:meth:`predict`'s scoring, the prior checked: the detector's
        heads on the cached features of each batch of same-sized images,
        with V' of a shared K x K prior (computed once), of a per-image
        stack or of a callable's priors."""
        results: List[Optional[InstanceData]] = [None] * len(indices)
        with evaluating(self.model), torch.no_grad(), progress_bar(
                desc='scoring', enabled=progress, total=len(indices),
                unit='img') as bar:
            cali = None
            if self.calibratable and stack is None and fn is None:
                cali = self._vectors(shared)
            for positions in self.cache.batches(indices, self.batch_size):
                idx = indices[positions]
                priors = shared
                if stack is not None:
                    priors = stack[torch.as_tensor(
                        positions, device=stack.device)]
                elif fn is not None:
                    priors = self._check(self._as_tensor(fn(idx)), len(idx))
                if self.calibratable:
                    priors = cali if priors is shared else \
                        self._vectors(priors)
                batch = self._predict_batch(idx, priors)
                for pos, result in zip(positions, batch):
                    results[int(pos)] = result if \
                        self.device.type == 'cpu' else result.cpu()
                bar.update(len(idx))
        return results

    def _predict_batch(self, idx: np.ndarray,
                       prior: Optional[Tensor]) -> List[InstanceData]:
        """The detections of a batch of cached images.

        Args:
            idx (np.ndarray): their cache indices (one feature size).
            prior (Tensor, optional): V' of a CaliDet detector, (K, d) or
                (B, K, d); a plain detector's prior for its correction,
                (K, K) or (B, K, K), or ``None``.

        Returns:
            list[InstanceData]: per image ``bboxes``, ``scores``,
            ``labels`` (original image coordinates).
        """
        if self._dense is None:
            return self._two_stage_predict(idx, prior)
        outs, inputs = self._dense.get(
            idx, lambda: self.cache.get(idx, self.device)[0])
        if self.calibratable:
            outs[0] = self._dense.calibrated_scores(outs[0], inputs, prior)
        elif self.correction is not None:
            if prior is None:
                raise ValueError('a post-hoc correction needs a prior')
            outs[0] = corrected_levels(outs[0], prior, self.correction)
        elif prior is not None:
            raise ValueError(f'{type(self.model).__name__} takes no prior; '
                             'pass a post-hoc correction to use one')
        return self.model.bbox_head.predict_by_feat(
            *outs,
            batch_img_metas=[
                self.cache.data_samples[int(k)].metainfo for k in idx
            ],
            rescale=True)

    def _two_stage_predict(self, idx: np.ndarray,
                           prior: Optional[Tensor]) -> List[InstanceData]:
        """A two-stage detector's detections of a batch, as
        ``TwoStageDetector.predict`` gives them after ``extract_feat``: the
        RPN's proposals and the box head's outputs but its class logits
        (run once per image and kept: the prior reaches neither), then
        the RoI head's post-processing of the class logits under
        ``prior`` (V' of a CaliDet head, a plain one's prior for its
        correction)."""
        feats, samples = self.cache.get(idx, self.device)
        if samples[0].get('proposals', None) is not None:
            proposals = [s.proposals for s in samples]
        else:
            if any(int(k) not in self._proposals for k in idx):
                found = self.model.rpn_head.predict(
                    feats, samples, rescale=False)
                self._proposals.update(zip(map(int, idx), found))
            proposals = [self._proposals[int(k)] for k in idx]
        head = self.model.roi_head.bbox_head
        if self.calibratable:
            calibrated = self.model.calibrated_head.calibrated(prior)

            def score(x: Tensor, images: Tensor) -> Tensor:
                return self.model.calibrated_head.cls_score(
                    x, roi_images=images)
        elif self.correction is not None:
            if prior is None:
                raise ValueError('a post-hoc correction needs a prior')
            calibrated = contextlib.nullcontext()

            def score(x: Tensor, images: Tensor) -> Tensor:
                return corrected_roi_scores(
                    head.fc_cls(x), self.correction, prior, images)
        else:
            if prior is not None:
                raise ValueError(f'{type(self.model).__name__} takes no '
                                 'prior; pass a post-hoc correction to use '
                                 'one')
            calibrated = contextlib.nullcontext()

            def score(x: Tensor, images: Tensor) -> Tensor:
                return head.fc_cls(x)

        with calibrated, self._roi.scoring(feats, proposals, idx, score):
            return self.model.roi_head.predict(
                feats, proposals, samples, rescale=True)


def is_plain_one_stage(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain one-stage detector HeadRescorer scores:
    ``extract_feat``, a dense ``bbox_head`` with ``predict_by_feat``, no
    RoI head and no decoder."""
    return hasattr(model, 'extract_feat') and has_dense_head(model)


def is_plain_two_stage(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain two-stage detector HeadRescorer scores
    (without a correction): ``extract_feat``, an RPN head and a RoI head,
    and no calibration (``predict_from_feats``)."""
    return (hasattr(model, 'extract_feat') and hasattr(model, 'rpn_head')
            and hasattr(model, 'roi_head')
            and not hasattr(model, 'predict_from_feats'))


def corrected_levels(levels: List[Tensor], priors: Tensor,
                     correction: Callable) -> List[Tensor]:
    """A post-hoc correction of a dense head's class logits: the levels'
    (B, K, H, W) maps as one (B, locations, K) tensor, corrected, split
    back.

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


def rescorer_for(model: torch.nn.Module,
                 images,
                 correction: Optional[Callable] = None,
                 batch_size: int = 64) -> Rescorer:
    """The re-scorer of a detector over images: a :class:`HeadRescorer`
    for a one- or two-stage detector, else a :class:`Rescorer`.

    Args:
        model (nn.Module): the detector.
        images: its :class:`FeatureCache` (one- or two-stage), its
            :class:`~mmcalidet.decoder_cache.DecoderCache` (DETR), or image
            paths / arrays, cached here through the model's test pipeline.
        correction (callable, optional): a post-hoc correction for a plain
            DETR (see :class:`Rescorer`).
        batch_size (int): images per re-scoring step.

    Returns:
        Rescorer: the re-scorer.
    """
    from ..decoder_cache import DecoderCache, cache_images, image_batches
    if isinstance(images, FeatureCache):
        return HeadRescorer(model, images, correction, batch_size)
    if isinstance(images, DecoderCache):
        return Rescorer(model, images, correction, batch_size)
    images = list(images)
    if hasattr(model, 'predict_from_feats') or is_plain_one_stage(model) \
            or is_plain_two_stage(model):
        cache = FeatureCache.from_batches(model, image_batches(model, images))
        return HeadRescorer(model, cache, correction, batch_size)
    return Rescorer(model, cache_images(model, images), correction, batch_size)
