# Copyright (c) mmcalidet contributors. All rights reserved.
"""Re-score cached decoder outputs under any prior.

Only the classification branch of the last decoder layer runs: the
wrapped head's plain logits of that layer (the decoder kind's
:meth:`~mmcalidet.models.head_kinds.DecoderKind.layer_logits`), then, for
a CaliDet head, its own ``calibrate_cls_scores`` with V' of the prior (or,
for a plain detector, a post-hoc correction from
:mod:`mmcalidet.evaluation.baselines`), then the head's
``predict_by_feat`` (top-k, boxes to image coordinates). The result
equals ``model.predict`` under the same prior on the same batches.
"""
import contextlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData
from torch import Tensor

from ..apis.inference import is_calibratable
from ..decoder_cache import DecoderCache, with_predictions
from ..models.head_kinds import find_head_kind, head_kind_of
from ..models.layers.support_ops import check_support
from ..utils.progress import progress_bar

#: a prior argument: ``None`` (the model's deployment prior), a K x K
#: matrix shared by all images, an (N, K, K) stack aligned with the images
#: scored, or a callable mapping image indices to a (B, K, K) stack
PriorArg = Union[None, np.ndarray, Tensor, Callable[[np.ndarray], np.ndarray]]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's parameters."""
    return next(model.parameters()).device


class Rescorer:
    """Predictions from a :class:`~mmcalidet.decoder_cache.DecoderCache`
    (its last stored decoder layer) under any prior.

    Args:
        model (nn.Module): the detector that filled the cache.
        cache (DecoderCache): the cache.
        correction (callable, optional): a post-hoc correction
            ``correction(logits, priors) -> logits`` for a plain detector
            (see :mod:`mmcalidet.evaluation.baselines`). ``None``: CaliDet
            calibration for a CaliDet model, raw scores otherwise.
        batch_size (int): images per re-scoring step.
    """

    def __init__(self,
                 model: torch.nn.Module,
                 cache: DecoderCache,
                 correction: Optional[Callable] = None,
                 batch_size: int = 64) -> None:
        if not len(cache):
            raise ValueError('the cache is empty')
        self.model = model
        self.cache = cache
        self.correction = correction
        self.batch_size = max(1, int(batch_size))
        self.calibratable = is_calibratable(model)
        self._check_model(model, correction)
        #: the adapter of the model's head kind
        self.kind = head_kind_of(model)
        self.device = model_device(model)
        # (prior, images) -> predictions, while remembering (remember())
        self._memo: Optional[Dict] = None
        self._keep = True
        #: predict() calls that scored / that reused remembered predictions
        self.calls = dict(scored=0, reused=0)
        #: float32 bytes of a registered prior -> its (support, marginals)
        self._supports: Dict[bytes, Tuple[Tensor, Tensor]] = {}

    def _check_model(self, model: torch.nn.Module,
                     correction: Optional[Callable]) -> None:
        """Refuse a model this scorer cannot re-score: a correction for a
        CaliDet model, a one- or two-stage detector (no decoder; see
        :class:`~mmcalidet.evaluation.HeadRescorer`)."""
        if self.calibratable and correction is not None:
            raise ValueError('post-hoc corrections are baselines for plain '
                             'detectors; a CaliDet model calibrates itself')
        kind = find_head_kind(model)
        if kind is not None and kind.feature_cache:
            raise TypeError(
                f'{type(model).__name__} has no decoder to cache: score it '
                'with HeadRescorer on a FeatureCache '
                '(mmcalidet.evaluation.head_scoring)')

    @property
    def head(self) -> torch.nn.Module:
        """The head whose classification is re-scored (the head kind's:
        a DETR's or one-stage detector's ``bbox_head``, a two-stage
        detector's box head)."""
        return self.kind.head(self.model)

    @property
    def reads_support(self) -> bool:
        """Whether the model's CaliFormer reads a prior's support
        (``support_features`` or ``lift_bias``, experimental)."""
        if not self.calibratable:
            return False
        califormer = self.head.califormer
        return bool(
            getattr(califormer, 'use_support_features', False)
            or getattr(califormer, 'use_lift_bias', False))

    def register_support(self, prior, support, marginals) -> None:
        """Say what a prior was measured on: wherever this matrix is
        scored from now on (shared, or a row of a per-image stack), V'
        comes with its support, as :meth:`set_prior`'s ``support`` and
        ``marginals``. Nothing changes for a model whose CaliFormer reads
        no support; a prior never registered has none (today's V').

        Args:
            prior (array-like): a K x K prior, or an (N, K, K) stack.
            support (array-like): (K,) images per column, or (N, K).
            marginals (array-like): (K,) class shares, or (N, K).
        """
        if not self.reads_support:
            return
        priors = self._as_tensor(prior)
        if priors.dim() == 2:
            priors = priors[None]
        num, k = len(priors), self.num_classes
        self._check(priors, num)
        like = priors.new_zeros(())
        support = check_support(self._as_tensor(support), num, k, 'support',
                                like)
        marginals = check_support(
            self._as_tensor(marginals), num, k, 'marginals', like)
        if bool((marginals > 1).any()):
            raise ValueError('marginals must lie in [0, 1]')
        changed = set()
        for p, n, m in zip(priors, support, marginals):
            key = p.cpu().numpy().tobytes()
            old = self._supports.get(key)
            if old is None or not (torch.equal(old[0], n)
                                   and torch.equal(old[1], m)):
                changed.add(key)
            self._supports[key] = (n, m)
        if self._memo and changed:
            # predictions remembered for these priors (shared) were scored
            # without this support; a stack's are never remembered
            for key in [k for k in self._memo if k[0] in changed]:
                del self._memo[key]

    def support_of(self, prior) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The (support, marginals) registered for a K x K prior, as
        (K,) arrays, or ``None`` (none registered, or a model that reads
        no support)."""
        if not self._supports:
            return None
        found = self._supports.get(self._as_tensor(prior).cpu().numpy(
        ).tobytes())
        if found is None:
            return None
        return tuple(t.cpu().numpy().copy() for t in found)

    def _cali_vectors(self, priors: Tensor) -> Tensor:
        """V' of a (K, K) prior or a (B, K, K) stack (once per distinct
        prior), with the support of registered priors."""
        head = self.head
        single = priors.dim() == 2
        stack = priors[None] if single else priors
        unique, inverse = torch.unique(
            stack.flatten(1), dim=0, return_inverse=True)
        unique = unique.view(-1, *stack.shape[1:])
        found = [
            self._supports.get(u.cpu().numpy().tobytes()) for u in unique
        ]
        with_support = [i for i, f in enumerate(found) if f is not None]
        without = [i for i, f in enumerate(found) if f is None]
        cali = unique.new_empty(len(unique), self.num_classes,
                                head.calibrated_feature_dims())
        if without:
            cali[without] = head.get_cali_vectors(unique[without])
        if with_support:
            cali[with_support] = head.get_cali_vectors(
                unique[with_support],
                torch.stack([found[i][0] for i in with_support]),
                torch.stack([found[i][1] for i in with_support]))
        cali = cali[inverse]
        return cali[0] if single else cali

    def remember(self, enabled: bool = True) -> None:
        """Keep the predictions of every (shared prior, image list) scored
        from now on, and give them back when the same prior (as the model
        sees it: float32) is asked for on the same images in the same
        order, e.g. E_t or E_site of a site in several tables. The
        predictions are the same objects: do not change them. ``False``
        forgets them and stops.

        Args:
            enabled (bool): remember (``True``) or forget (``False``).
        """
        self._memo = {} if enabled else None

    @contextlib.contextmanager
    def keeping_none(self):
        """While remembering, keep no new predictions in this block (the
        one-off priors of a fit's candidates), still reusing those kept."""
        keep, self._keep = self._keep, False
        try:
            yield self
        finally:
            self._keep = keep

    @property
    def num_classes(self) -> int:
        return self.head.num_classes

    def _as_tensor(self, prior) -> Tensor:
        return torch.as_tensor(
            np.asarray(prior) if not isinstance(prior, Tensor) else prior,
            dtype=torch.float32,
            device=self.device)

    def _check(self, priors: Tensor, batch: Optional[int]) -> Tensor:
        k = self.num_classes
        shape = (k, k) if batch is None else (batch, k, k)
        if tuple(priors.shape) != shape:
            raise ValueError(f'expected priors of shape {shape}, got '
                             f'{tuple(priors.shape)}')
        return priors

    def logits(self,
               hidden: Tensor,
               priors: Optional[Tensor],
               cali_vectors: Optional[Tensor] = None) -> Tensor:
        """Last-layer logits (B, Q, C) of cached hidden states.

        Args:
            hidden (Tensor): (B, Q, d).
            priors (Tensor, optional): (K, K) or (B, K, K); ``None``: the
                deployment prior (CaliDet) or no prior (plain).
            cali_vectors (Tensor, optional): V' of a shared prior, to
                skip the CaliFormer.

        Returns:
            Tensor: the logits the full head gives for that layer.
        """
        head = self.model.bbox_head
        logits = self.kind.layer_logits(head, hidden, self.cache.layer_index)
        if self.calibratable:
            if cali_vectors is None and priors is None:
                cali_vectors = self.model.deployment_cali_vectors()
            elif cali_vectors is None and self._supports:
                cali_vectors = self._cali_vectors(priors)
            elif cali_vectors is None and priors.dim() == 3:
                # images of a group (E_b) share a prior: V' once per prior
                unique, inverse = torch.unique(
                    priors.flatten(1), dim=0, return_inverse=True)
                cali_vectors = head.get_cali_vectors(
                    unique.view(-1, *priors.shape[1:]))[inverse]
            elif cali_vectors is None:
                cali_vectors = head.get_cali_vectors(priors)
            return head.calibrate_cls_scores(logits[None], hidden[None],
                                             cali_vectors)[0]
        if self.correction is not None:
            if priors is None:
                raise ValueError('a post-hoc correction needs a prior')
            return self.correction(logits, priors)
        if priors is not None:
            raise ValueError(f'{type(self.model).__name__} takes no prior; '
                             'pass a post-hoc correction to use one')
        return logits

    def predict(self,
                prior: PriorArg = None,
                indices: Optional[Sequence[int]] = None,
                progress: bool = False) -> List[InstanceData]:
        """Detections of cached images under a prior.

        Args:
            prior: see :data:`PriorArg`.
            indices (Sequence[int], optional): the images (default all).
            progress (bool): show a progress bar.

        Returns:
            list[InstanceData]: per image (in ``indices`` order): ``bboxes``
            (xyxy, original image coordinates), ``scores``, ``labels``, on
            the CPU.
        """
        indices = np.arange(len(self.cache)) if indices is None else \
            np.asarray(indices, dtype=np.int64)
        shared, stack, fn = None, None, None
        if callable(prior) and not isinstance(prior, (np.ndarray, Tensor)):
            fn = prior
        elif prior is not None:
            tensor = self._as_tensor(prior)
            if tensor.dim() == 3:
                stack = self._check(tensor, len(indices))
            else:
                shared = self._check(tensor, None)
        key = None
        if self._memo is not None and fn is None and stack is None:
            key = (None if shared is None else
                   shared.detach().cpu().numpy().tobytes(),
                   indices.astype(np.int64).tobytes())
            if key in self._memo:
                self.calls['reused'] += 1
                return list(self._memo[key])
        self.calls['scored'] += 1
        results = self._predict(shared, stack, fn, indices, progress)
        if key is not None and self._keep:
            self._memo[key] = list(results)
        return results

    def _predict(self, shared: Optional[Tensor], stack: Optional[Tensor],
                 fn: Optional[Callable], indices: np.ndarray,
                 progress: bool) -> List[InstanceData]:
        """:meth:`predict`'s scoring, the prior checked: a shared K x K
        prior, a per-image stack or a callable."""
        head = self.model.bbox_head
        results: List[InstanceData] = []
        with torch.no_grad(), progress_bar(
                desc='scoring', enabled=progress, total=len(indices),
                unit='img') as bar:
            cali = None
            if self.calibratable and shared is not None:
                cali = self._cali_vectors(shared) if self._supports else \
                    head.get_cali_vectors(shared)
            for start in range(0, len(indices), self.batch_size):
                idx = indices[start:start + self.batch_size]
                hidden, boxes, samples = self.cache.get(idx, self.device)
                priors = shared
                if stack is not None:
                    priors = stack[start:start + len(idx)]
                elif fn is not None:
                    priors = self._check(self._as_tensor(fn(idx)), len(idx))
                logits = self.logits(hidden, priors,
                                     cali if priors is shared else None)
                batch = head.predict_by_feat(
                    logits[None],
                    boxes[None],
                    batch_img_metas=[ds.metainfo for ds in samples],
                    rescale=True)
                # on the CPU already: no copy (InstanceData.cpu() rebuilds
                # every result)
                results.extend(batch if self.device.type == 'cpu' else (
                    r.cpu() for r in batch))
                bar.update(len(idx))
        return results

    def predict_samples(self,
                        prior: PriorArg = None,
                        indices: Optional[Sequence[int]] = None,
                        progress: bool = False) -> List[DetDataSample]:
        """:meth:`predict`, as data samples (metainfo, ground truth and
        ``pred_instances``) like ``model.test_step`` returns them."""
        indices = np.arange(len(self.cache)) if indices is None else \
            np.asarray(indices, dtype=np.int64)
        preds = self.predict(prior, indices, progress)
        return [
            with_predictions(self.cache.data_samples[k], p)
            for k, p in zip(indices, preds)
        ]
