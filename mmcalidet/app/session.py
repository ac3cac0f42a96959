# Copyright (c) mmcalidet contributors. All rights reserved.
"""The detector behind the prior page: one model, the priors it is shown
under, and V' computed once per prior.

The page detects every image under two priors (E_t and the chosen one) and
evaluates a site under both. Each prior is injected with
``model.set_prior`` (V' = CaliFormer(V, E - E0) computed once), and the V'
of the last :data:`CACHE_SIZE` priors is kept, so that going back to a
prior costs no CaliFormer pass: a prediction never computes V' itself.
Requests are served one at a time (a lock), since the deployment prior is
the model's state.
"""
import hashlib
import os.path as osp
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..priors.prior import Prior
from ..priors.statistics import flat_prior
from ..utils.image_files import MAX_PIXELS, check_image

#: the V' kept (one per prior, the least recently used dropped first)
CACHE_SIZE = 8
#: the names of the two priors every model has
TRAIN_PRIOR, FLAT_PRIOR = 'E_t', 'E0'


def prior_key(prior: Prior) -> str:
    """A fingerprint of what reaches the CaliFormer: the matrix and the
    support (a prior's name and notes do not change V').

    Args:
        prior (Prior): the prior.

    Returns:
        str: a hex digest.
    """
    digest = hashlib.sha1(
        np.ascontiguousarray(prior.matrix, np.float64).tobytes())
    if prior.has_support:
        for values in prior.support_pair():
            digest.update(np.ascontiguousarray(values, np.float64).tobytes())
    return digest.hexdigest()


class PriorSession:
    """A CaliDet detector and the priors the page detects under.

    Args:
        model (nn.Module): a calibratable detector in eval mode, with
            ``dataset_meta['classes']`` (:func:`mmcalidet.apis.
            init_detector` makes one); its current prior is E_t.
        max_pixels (int): the largest image (width x height) accepted,
            read from the file's header before it is decoded.
        priors (dict, optional): more named priors offered beside E_t, E0
            (bundled priors, a site's statistics): name -> prior source.
        examples (Sequence[str]): example image files.
    """

    def __init__(
        self,
        model: nn.Module,
        max_pixels: int = MAX_PIXELS,
        priors: Optional[Dict[str, Any]] = None,
        examples: Sequence[str] = ()
    ) -> None:
        from ..apis import is_calibratable
        if not is_calibratable(model):
            raise ValueError('the prior page needs a calibratable detector '
                             f'(CaliDet), got {type(model).__name__}')
        self.model = model
        self.classes: List[str] = list(model.dataset_meta['classes'])
        self.max_pixels = int(max_pixels)
        self.examples = list(examples)
        train = model.current_prior()
        self.train_prior = train.renamed(TRAIN_PRIOR) \
            if train.classes is not None else Prior(
                train.matrix, self.classes, *(train.support_pair()
                                              or (None, None)),
                meta=train.meta, name=TRAIN_PRIOR)
        self.named: Dict[str, Prior] = OrderedDict()
        self.named[TRAIN_PRIOR] = self.train_prior
        self.named[FLAT_PRIOR] = Prior(
            flat_prior(len(self.classes)), self.classes, name=FLAT_PRIOR)
        for name, src in (priors or {}).items():
            self.named[name] = self.resolve(src, name=name)
        self._lock = threading.Lock()
        self._vectors: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
        self._current: Optional[str] = None
        #: CaliFormer passes made (what the cache saves shows here)
        self.califormer_passes = 0

    # priors -----------------------------------------------------------
    def resolve(self, src: Any, name: Optional[str] = None) -> Prior:
        """A prior for this model: one of :attr:`named`, a prior file, a
        shipped name, a dict or a matrix, in the model's class order.

        Args:
            src: the prior (a name of :attr:`named` first).
            name (str, optional): how errors name it.

        Returns:
            Prior: validated, with the model's class names.

        Raises:
            ValueError: one line naming the prior and the problem (the
                ``Prior`` constructor's, or an unknown class name).
        """
        if isinstance(src, Prior):
            prior = self.model.resolve(src)
        elif isinstance(src, str) and src in self.named:
            return self.named[src]
        else:
            if isinstance(src, str) and not src.strip():
                raise ValueError('no prior given: name one (E_t, E0, a '
                                 'bundled prior) or give a prior file')
            if name is None and isinstance(src, str):
                name = osp.basename(src)
            if name is not None and isinstance(src, str):
                # errors name the file as the user knows it (an upload's
                # name, not its temporary path)
                src = Prior.load(src, classes=self.classes, name=name)
            prior = self.model.resolve(src)
        if prior.classes is None:
            prior = prior.reorder(self.classes)
        return prior.renamed(name) if name else prior

    # V' ---------------------------------------------------------------
    def _use(self, prior: Prior) -> None:
        """Make ``prior`` the model's (the lock held): ``set_prior``, then
        its V' from the cache, else computed once and kept."""
        key = prior_key(prior)
        if key == self._current:
            return
        self.model.set_prior(prior)
        self._current = key
        model = self.model
        with torch.no_grad():
            if key in self._vectors:
                self._vectors.move_to_end(key)
                # the model's own cache, keyed as it keys it
                model._cali_cache = (model._cache_key(), self._vectors[key])
            else:
                self._vectors[key] = model.deployment_cali_vectors()
                self.califormer_passes += 1
                while len(self._vectors) > CACHE_SIZE:
                    self._vectors.popitem(last=False)

    # detection --------------------------------------------------------
    def check_image(self, path: Optional[str]) -> str:
        """The image file, checked from its header (readable, within
        :attr:`max_pixels`).

        Raises:
            ValueError: one line naming the problem.
        """
        if not path:
            raise ValueError('no image: upload one or pick an example')
        if not osp.isfile(path):
            raise ValueError(f'image not found: {path}')
        reason = check_image(path, self.max_pixels)
        if reason is not None:
            raise ValueError(f'{osp.basename(path)}: {reason}')
        return path

    def detect(self,
               images: Sequence[str],
               prior: Prior,
               progress=None) -> list:
        """Detections of images under a prior.

        Args:
            images (Sequence[str]): checked image files.
            prior (Prior): from :meth:`resolve`.
            progress (callable, optional): ``progress(done)`` after each
                image.

        Returns:
            list[DetDataSample]: one prediction per image, boxes in the
            image's pixels.
        """
        from ..apis import inference_detector
        preds = []
        with self._lock, torch.no_grad():
            self._use(prior)
            for k, path in enumerate(images):
                preds.append(inference_detector(self.model, path))
                if progress is not None:
                    progress(k + 1)
        return preds

    def detections(self, pred, score_thr: float = 0.0) -> Dict[str, list]:
        """A prediction as the ``/detect`` endpoint returns it.

        Args:
            pred (DetDataSample): a prediction.
            score_thr (float): keep detections scoring at least this.

        Returns:
            dict: ``bboxes`` ([x1, y1, x2, y2] in pixels), ``scores``,
            ``labels`` (class indices) and ``classes`` (their names), the
            highest score first.
        """
        inst = pred.pred_instances
        scores = inst.scores.cpu().numpy().astype(np.float64)
        order = np.argsort(-scores, kind='stable')
        order = order[scores[order] >= score_thr]
        labels = inst.labels.cpu().numpy()[order].astype(int)
        return dict(
            bboxes=inst.bboxes.cpu().numpy()[order].astype(
                np.float64).round(2).tolist(),
            scores=scores[order].tolist(),
            labels=labels.tolist(),
            classes=[self.classes[k] for k in labels])
