# Copyright (c) mmcalidet contributors. All rights reserved.
"""Re-score a one- or two-stage CaliDet detector's cached features under
any prior.

:class:`HeadRescorer` is the :class:`~mmcalidet.evaluation.Rescorer` of
the detectors without a decoder (``CaliRTMDet``, ``CaliFCOS``,
``CaliFasterRCNN``): from a :class:`~mmcalidet.evaluation.FeatureCache`
it reruns the detector's prediction heads with V' of the prior, so the
result equals ``model.predict`` under the same prior on the same
batches. What it keeps of the heads per image, and how a prior reaches
their class logits, is the head kind's ``head_outputs``
(:class:`~mmcalidet.models.head_kinds.HeadKind`): a one-stage detector's
dense head run once per image, after which a prior costs the calibration
term and the post-processing
(:class:`~mmcalidet.evaluation.dense_outputs.DenseHeadOutputs`); a
two-stage detector's RPN and box head once per image (its proposals, the
classifier's inputs and box deltas), after which a prior costs the
classifier and the post-processing
(:class:`~mmcalidet.evaluation.roi_outputs.RoIHeadOutputs`). It also
scores a plain one- or two-stage detector (``RTMDet``, ``FasterRCNN``,
the baselines), as ``model.predict`` runs it or with a post-hoc
correction (:mod:`mmcalidet.evaluation.baselines`) of its class logits:
every location's of a dense head; the marginal re-weighting of a RoI
head's softmax (:mod:`mmcalidet.evaluation.roi_correction`).
Priors, memoisation and supports are the :class:`Rescorer`'s; only the
scoring step differs.
"""
from typing import Callable, List, Optional

import numpy as np
import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ..models.head_kinds import find_head_kind
from ..utils.progress import progress_bar
from .dense_outputs import corrected_levels  # noqa: F401 (its old home)
from .feature_cache import FeatureCache, evaluating
from .roi_correction import check_softmax_correction
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
        #: the heads' outputs, run once per image (the kind's
        #: ``head_outputs``)
        self._outputs = self.kind.part('head_outputs').for_model(model)

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
        kind = find_head_kind(model)
        if kind is not None and kind.feature_cache and \
                hasattr(model, 'extract_feat'):
            if kind.softmax and correction is not None:
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
        """The detections of a batch of cached images (the kind's
        ``head_outputs``' ``predict``).

        Args:
            idx (np.ndarray): their cache indices (one feature size).
            prior (Tensor, optional): V' of a CaliDet detector, (K, d) or
                (B, K, d); a plain detector's prior for its correction,
                (K, K) or (B, K, K), or ``None``.

        Returns:
            list[InstanceData]: per image ``bboxes``, ``scores``,
            ``labels`` (original image coordinates).
        """
        return self._outputs.predict(self, idx, prior)


def is_plain_two_stage(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain detector whose classifier scores with
    a softmax (a two-stage detector's RoI head): post-hoc corrections need
    a softmax form."""
    kind = find_head_kind(model)
    return kind is not None and kind.softmax and \
        not hasattr(model, 'predict_from_feats')


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
    kind = find_head_kind(model)
    if kind is not None and kind.feature_cache:
        cache = FeatureCache.from_batches(model, image_batches(model, images))
    else:
        cache = cache_images(model, images)
    rescorer = kind.part('rescorer') if kind is not None else Rescorer
    return rescorer(model, cache, correction, batch_size)
