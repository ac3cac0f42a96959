# Copyright (c) mmcalidet contributors. All rights reserved.
"""Re-score a one- or two-stage CaliDet detector's cached features under
any prior.

:class:`HeadRescorer` is the :class:`~mmcalidet.evaluation.Rescorer` of
the detectors without a decoder (``CaliRTMDet``, ``CaliFasterRCNN``): from
a :class:`~mmcalidet.evaluation.FeatureCache` it reruns the detector's
prediction heads (``predict_from_feats``: the dense head, or the RPN and
the RoI head) with V' of the prior, so the result equals ``model.predict``
under the same prior on the same batches. Priors, memoisation and
supports are the :class:`Rescorer`'s; only the scoring step differs.
"""
from typing import Callable, List, Optional

import numpy as np
import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ..utils.progress import progress_bar
from .feature_cache import FeatureCache, evaluating
from .scoring import Rescorer


class HeadRescorer(Rescorer):
    """Predictions of a one- or two-stage CaliDet detector from a
    :class:`FeatureCache` under any prior (:meth:`Rescorer.predict`).

    Args:
        model (nn.Module): a calibratable one- or two-stage detector
            (``CalibratableSingleStageMixin`` /
            ``CalibratableTwoStageMixin``, e.g. ``CaliRTMDet``,
            ``CaliFasterRCNN``), the one that filled the cache.
        cache (FeatureCache): its features of the images.
        correction: must be ``None``: a CaliDet detector calibrates itself
            (post-hoc corrections need a plain DETR and a
            :class:`Rescorer`).
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

    def _check_model(self, model: torch.nn.Module,
                     correction: Optional[Callable]) -> None:
        """Refuse all but a calibratable one- or two-stage detector, and
        any post-hoc correction."""
        supported = ('a calibratable one- or two-stage detector '
                     '(CalibratableSingleStageMixin or '
                     'CalibratableTwoStageMixin, e.g. CaliRTMDet, '
                     'CaliFasterRCNN)')
        if correction is not None:
            raise ValueError(
                'HeadRescorer takes no post-hoc correction: it scores '
                f'{supported}, which calibrates itself')
        if not (self.calibratable and hasattr(model, 'predict_from_feats')):
            raise TypeError(
                f'HeadRescorer scores {supported}; got '
                f'{type(model).__name__} (a DETR-family detector: Rescorer '
                'on a DecoderCache)')

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
            if stack is None and fn is None:
                cali = self._vectors(shared)
            for positions in self.cache.batches(indices, self.batch_size):
                idx = indices[positions]
                feats, samples = self.cache.get(idx, self.device)
                vectors = cali
                if stack is not None:
                    vectors = self._vectors(stack[torch.as_tensor(
                        positions, device=stack.device)])
                elif fn is not None:
                    vectors = self._vectors(
                        self._check(self._as_tensor(fn(idx)), len(idx)))
                batch = self.model.predict_from_feats(
                    feats, samples, rescale=True, cali_vectors=vectors)
                for pos, result in zip(positions, batch):
                    results[int(pos)] = result if \
                        self.device.type == 'cpu' else result.cpu()
                bar.update(len(idx))
        return results


def rescorer_for(model: torch.nn.Module,
                 images,
                 correction: Optional[Callable] = None,
                 batch_size: int = 64) -> Rescorer:
    """The re-scorer of a detector over images: a :class:`HeadRescorer`
    for a one- or two-stage CaliDet detector, else a :class:`Rescorer`.

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
    if hasattr(model, 'predict_from_feats'):
        cache = FeatureCache.from_batches(model, image_batches(model, images))
        return HeadRescorer(model, cache, correction, batch_size)
    return Rescorer(model, cache_images(model, images), correction, batch_size)
