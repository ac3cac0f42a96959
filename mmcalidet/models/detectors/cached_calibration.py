# Copyright (c) mmcalidet contributors. All rights reserved.
"""Calibrator training on cached decoder outputs, as its own model type.

A calibrator config (``configs/_base_/calibrator.py``) chooses it::

    model = dict(type='CachedCalibration', detector='CaliDINO', ...)

:func:`CachedCalibration` builds the named CaliDet detector with
:class:`CachedCalibrationMixin` in front: the same modules and parameter
names (its checkpoints are the detector's), the same inference, and a
``loss`` that takes the cached decoder outputs of
:class:`~mmcalidet.models.data_preprocessors.DecoderCachePreprocessor`
instead of images. The detector's own ``loss`` takes images only.

The losses on a cached batch are the head kind's
(:meth:`~mmcalidet.models.head_kinds.HeadKind.cached_losses`): a DETR's
decoder outputs, a one-stage head's cached locations (``CaliRTMDet``,
``CaliFCOS``), a two-stage box head's sampled RoIs (``CaliFasterRCNN``).

Each CaliDet detector has its cached twin written out below
(``CachedCaliDINO`` ...); a new detector writes one line,
``class CachedCaliX(CachedCalibrationMixin, CaliX)``, and
``CachedCalibration(detector='CaliX')`` finds it.
"""
from typing import Dict, Optional, Type

from mmdet.registry import MODELS
from mmdet.structures import SampleList
from torch import Tensor, nn

from ...utils.cache_kinds import (FOLDER_METAINFO, HEAD_METAINFO, TARGET_HEADS,
                                  CacheKindError, kind_text)
from ..data_preprocessors import is_cached_batch
from ..head_kinds import HeadKind, head_kind_of
from .cali_dab_detr import CaliDABDETR
from .cali_deformable_detr import CaliDeformableDETR
from .cali_dino import CaliDINO
from .cali_faster_rcnn import CaliFasterRCNN
from .cali_fcos import CaliFCOS
from .cali_rtmdet import CaliRTMDet
from .calibratable import CalibratableDetectorMixin

#: a CaliDet detector class -> its cached twin (filled by the twins'
#: definitions, :meth:`CachedCalibrationMixin.__init_subclass__`)
CACHED_TYPES: Dict[type, type] = {}


class CachedCalibrationMixin:
    """Put in front of a CaliDet detector, ``class CachedCaliX(
    CachedCalibrationMixin, CaliX)``: ``loss`` trains the calibrator on a
    cache of the head's kind (a DETR's decoder outputs, a one-stage head's
    locations, a box head's RoIs).

    A subclass is the twin :func:`CachedCalibration` builds for its
    detector; it keeps the detector's ``__name__`` (reports, exports and
    logs name the model as the detector) and is found by its qualified
    name, ``Cached<Detector>`` (pickles).

    Args:
        cache_train_cls_branches (bool): let the head's classification
            layers (a DETR's decoder-layer branches, a dense head's
            classification convs, a box head's classifier) learn too; by
            default only the CaliFormer does. Defaults to False.
        *args, **kwargs: the arguments of the detector.
    """

    #: the registered type of the detector (set for each twin)
    detector_type = ''

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if CachedCalibrationMixin not in cls.__bases__:
            return
        detector = next(base for base in cls.__bases__
                        if base is not CachedCalibrationMixin)
        cls.detector_type = detector.__name__
        # named as the detector it is; __qualname__ stays Cached<Detector>
        cls.__name__ = detector.__name__
        CACHED_TYPES[detector] = cls

    def __init__(self,
                 *args,
                 cache_train_cls_branches: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache_train_cls_branches = bool(cache_train_cls_branches)

    def calibrated_head_name(self) -> str:
        """The calibrated head's name in the detector (``bbox_head``, a
        two-stage detector's ``roi_head.bbox_head``)."""
        head = self.calibrated_head
        return next(name for name, module in self.named_modules()
                    if module is head)

    @property
    def head_kind(self) -> HeadKind:
        """The adapter of this detector's head kind."""
        return head_kind_of(self)

    def cache_kind(self) -> str:
        """The kind of cache this detector's head trains on
        (``meta['head']``): ``'decoder'`` (a DETR's), ``'dense'`` (a
        one-stage head's) or ``'roi'`` (a two-stage box head's)."""
        return self.head_kind.name

    def cache_width(self) -> int:
        """The width of the features this detector's calibrated head
        classifies (what a cache of its kind stores as hidden states,
        :meth:`~mmcalidet.models.head_kinds.HeadKind.feature_width`)."""
        return self.head_kind.feature_width(self.calibrated_head)

    def calibrator_modules(self) -> Dict[str, nn.Module]:
        """What the training updates, by name in the detector: the
        CaliFormer and, with ``cache_train_cls_branches``, the head's
        classification layers (a DETR's decoder-layer branches, not the
        encoder's proposal classifier; a dense head's classification
        convs; a box head's classifier)."""
        head, prefix = self.calibrated_head, self.calibrated_head_name()
        modules = {f'{prefix}.califormer': head.califormer}
        if not self.cache_train_cls_branches:
            return modules
        modules.update({
            f'{prefix}.{name}': layer
            for name, layer in self.head_kind.cls_layers(head).items()
        })
        return modules

    def loss(self, batch_inputs: Dict[str, Tensor],
             batch_data_samples: SampleList) -> dict:
        """The calibrator's losses on cached decoder outputs: the CaliFormer
        (and, with ``cache_train_cls_branches``, the classification
        branches) learn from each sample's prior (the EdgeSampler's draw)
        with the calibrated head's losses on its kind's cache
        (:meth:`~mmcalidet.models.head_kinds.HeadKind.cached_losses`).

        Args:
            batch_inputs (dict): ``hidden_states`` (L, B, Q, d) and
                ``bbox_preds`` (L, B, Q, 4); a dense or box head's cache
                adds ``targets`` (B, Q, 4).
            batch_data_samples (list[DetDataSample]): with
                ``gt_instances`` (and ``prior`` / ``sample_prior``).

        Returns:
            dict[str, Tensor]: the loss components.

        Raises:
            TypeError: the inputs are images, not cached decoder outputs.
            CacheKindError: the batch comes from a cache of another kind
                or feature width than this detector's head trains on (a
                ``CacheError`` and a ``TypeError``).
        """
        if not is_cached_batch(batch_inputs):
            raise TypeError(
                f'{type(self).__qualname__} trains on cached decoder outputs '
                '(DecoderCachePreprocessor), got '
                f'{type(batch_inputs).__name__}: train on images with the '
                f'detector itself (model.type={self.detector_type!r})')
        self._batch_kind(batch_inputs, batch_data_samples)
        self.check_classes_matched()
        hidden = batch_inputs['hidden_states']
        priors = self.batch_priors(batch_data_samples)
        support, marginals = self.batch_support(batch_data_samples)
        if priors is None:
            priors = self.prior.expand(hidden.shape[1], -1, -1)
        head = self.calibrated_head
        cali_vectors = head.get_cali_vectors(priors, support, marginals)
        return self.head_kind.cached_losses(head, batch_inputs,
                                            batch_data_samples, cali_vectors,
                                            priors,
                                            self.cache_train_cls_branches)

    def _batch_kind(self,
                    batch_inputs: Dict[str, Tensor],
                    batch_data_samples: Optional[SampleList] = None) -> str:
        """The batch's kind of cache (:meth:`cache_kind`), checked: the
        kind the cache's ``meta['head']`` records (its data samples'
        ``cache_head``, from :class:`~mmcalidet.datasets.
        DecoderCacheDataset`; else whether the batch has targets) must be
        this detector's, and its features of the head's width
        (:meth:`cache_width`).

        Args:
            batch_inputs (dict): the cached batch.
            batch_data_samples (list[DetDataSample], optional): its data
                samples.

        Returns:
            str: the kind.

        Raises:
            CacheKindError: another kind or width, in one line naming
                both kinds (or both widths) and the cache folder.
        """
        kind = self.cache_kind()
        head = type(self.calibrated_head).__name__
        recorded = {
            ds.metainfo.get(HEAD_METAINFO)
            for ds in batch_data_samples or ()
        } - {None}
        folders = {
            ds.metainfo.get(FOLDER_METAINFO)
            for ds in batch_data_samples or ()
        } - {None}
        where = f'the cache {sorted(folders)[0]}' if folders else 'the batch'
        has_targets = 'targets' in batch_inputs
        if len(recorded) > 1:
            raise CacheKindError(
                f'the batch mixes caches of kinds {sorted(recorded)}: '
                f'{head} trains on {kind_text(kind)}')
        if recorded:
            batch_kind = recorded.pop()
        elif has_targets:  # a dense or roi batch without its record
            batch_kind = kind if kind in TARGET_HEADS else 'dense or roi'
        else:
            batch_kind = 'decoder'
        if batch_kind != kind or has_targets != (kind in TARGET_HEADS):
            raise CacheKindError(
                f'{head} trains on {kind_text(kind)}, {where} is '
                f'{kind_text(batch_kind)}: make the cache from this '
                "detector's baseline")
        dims, width = batch_inputs['hidden_states'].shape[-1], \
            self.cache_width()
        if dims != width:
            raise CacheKindError(
                f'{head} classifies {width}-wide features, {where} holds '
                f'{dims}-wide ones ({kind_text(kind)} of another '
                "detector): make the cache from this detector's baseline")
        return kind


class CachedCaliDINO(CachedCalibrationMixin, CaliDINO):
    """CaliDINO trained on cached decoder outputs."""


class CachedCaliDeformableDETR(CachedCalibrationMixin, CaliDeformableDETR):
    """CaliDeformableDETR trained on cached decoder outputs."""


class CachedCaliDABDETR(CachedCalibrationMixin, CaliDABDETR):
    """CaliDABDETR trained on cached decoder outputs."""


class CachedCaliRTMDet(CachedCalibrationMixin, CaliRTMDet):
    """CaliRTMDet trained on a dense head's cached locations."""


class CachedCaliFCOS(CachedCalibrationMixin, CaliFCOS):
    """CaliFCOS trained on a dense head's cached locations."""


class CachedCaliFasterRCNN(CachedCalibrationMixin, CaliFasterRCNN):
    """CaliFasterRCNN trained on a box head's cached RoIs."""


def cached_calibration_type(detector: Type[nn.Module]) -> type:
    """The cached twin of a CaliDet detector class (``CachedCaliDINO`` of
    ``CaliDINO``): the class written out as
    ``class Cached<Detector>(CachedCalibrationMixin, <Detector>)``.

    Args:
        detector (type): a CaliDet detector class
            (:class:`CalibratableDetectorMixin`).

    Returns:
        type: its twin.

    Raises:
        TypeError: ``detector`` is not a CaliDet detector, or has no twin.
    """
    if not (isinstance(detector, type)
            and issubclass(detector, CalibratableDetectorMixin)):
        raise TypeError('CachedCalibration: detector must be a CaliDet '
                        'detector type (e.g. CaliDINO), got '
                        f'{getattr(detector, "__name__", detector)!r}')
    if detector not in CACHED_TYPES:
        raise TypeError(
            f'CachedCalibration: {detector.__name__} has no cached twin: '
            f'write class Cached{detector.__name__}(CachedCalibrationMixin, '
            f'{detector.__name__}) (mmcalidet/models/detectors/'
            'cached_calibration.py)')
    return CACHED_TYPES[detector]


@MODELS.register_module()
def CachedCalibration(detector: str, **kwargs) -> nn.Module:
    """Build a CaliDet detector for calibrator training on cached decoder
    outputs (the model of a calibrator config).

    Args:
        detector (str): the detector's registered type, e.g. ``'CaliDINO'``.
        **kwargs: the detector's arguments, and
            ``cache_train_cls_branches`` (see
            :class:`CachedCalibrationMixin`).

    Returns:
        nn.Module: the detector's cached twin
        (:func:`cached_calibration_type`).
    """
    detector_cls = MODELS.get(detector) if isinstance(detector,
                                                      str) else detector
    if detector_cls is None:
        raise KeyError(f'CachedCalibration: {detector!r} is not a '
                       'registered model type')
    return cached_calibration_type(detector_cls)(**kwargs)
