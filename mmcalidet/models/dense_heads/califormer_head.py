# Copyright (c) mmcalidet contributors. All rights reserved.
"""The CaliFormer a calibrated head owns, whatever its classifier.

Every calibrated classifier computes ``(W + rho * V')^T h + b``: a DETR
decoder layer's linear branch (:class:`CalibratedClsMixin`), a one-stage
head's 1 x 1 classification convs (:class:`CalibratedDenseClsMixin`). This
base holds what they share: the CaliFormer that turns a prior into V', the
scale rho and the flat prior E0.
"""
import contextlib
import copy
from typing import Iterator, Optional, Tuple

from mmdet.registry import MODELS
from mmdet.utils import ConfigType
from torch import Tensor

from ..layers import flat_prior_like


class CaliFormerHeadMixin:
    """A head's CaliFormer (V' from a prior) and the scale rho.

    The CaliFormer's ``num_classes`` and ``embed_dims`` default to the
    head's K and to :meth:`calibrated_feature_dims`, the width of the
    features its classifier reads.

    Args:
        califormer (dict): config of the :class:`CaliFormer`. Defaults to
            ``dict(type='CaliFormer')``.
        rho (float): the scale of the calibration vectors. Defaults to 0.2.
    """

    def __init__(self,
                 *args,
                 califormer: ConfigType = dict(type='CaliFormer'),
                 rho: float = 0.2,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        califormer = copy.deepcopy(califormer)
        dims = self.calibrated_feature_dims()
        califormer.setdefault('num_classes', self.num_classes)
        califormer.setdefault('embed_dims', dims)
        if califormer['num_classes'] != self.num_classes or \
                califormer['embed_dims'] != dims:
            raise ValueError(
                'califormer must have the head\'s num_classes and '
                f'embed_dims ({self.num_classes}, {dims}), got '
                f'({califormer["num_classes"]}, {califormer["embed_dims"]})')
        self.califormer = MODELS.build(califormer)
        self.rho = rho

    def calibrated_feature_dims(self) -> int:
        """d, the width of the features the calibrated classifier reads
        (a DETR head's ``embed_dims``)."""
        return self.embed_dims

    def init_weights(self) -> None:
        """Initialise the wrapped head, then the CaliFormer."""
        super().init_weights()
        self.califormer.init_weights()

    def flat_priors(self, like: Tensor) -> Tensor:
        """E0 (K x K) on the device of ``like``, the prior of "nothing is
        known"."""
        return flat_prior_like(
            like.new_empty((self.num_classes, self.num_classes)))

    def resolve_priors(self, features: Tensor, cali_vectors: Optional[Tensor],
                       priors: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """The V' and priors a training loss uses: E0 when none is given,
        V' computed from the priors when not passed.

        Args:
            features (Tensor): the classifier's input (gives dtype and
                device).
            cali_vectors (Tensor, optional): V' for ``priors``.
            priors (Tensor, optional): the injected priors.

        Returns:
            tuple[Tensor, Tensor]: ``(cali_vectors, priors)``.
        """
        if priors is None:
            if cali_vectors is not None:
                raise ValueError('pass the priors that gave cali_vectors '
                                 '(LoMa needs them)')
            priors = self.flat_priors(features)
        if cali_vectors is None:
            cali_vectors = self.get_cali_vectors(priors)
        return cali_vectors, priors

    def get_cali_vectors(self,
                         priors: Tensor,
                         support: Optional[Tensor] = None,
                         marginals: Optional[Tensor] = None) -> Tensor:
        """V' for one prior (K x K -> K x d) or a batch (B x K x K ->
        B x K x d); ``support`` / ``marginals`` (experimental, see
        :class:`CaliFormer`) only when given."""
        if support is None and marginals is None:
            return self.califormer(priors)
        return self.califormer(priors, support=support, marginals=marginals)


class CalibrationContextMixin(CaliFormerHeadMixin):
    """A head whose detector hands it V' for a call rather than as a
    ``forward`` argument (one- and two-stage heads, whose mmdet ``loss``
    and ``predict`` call ``forward`` themselves): :meth:`calibrated` sets
    V' and the training priors inside a block, :meth:`current_cali_vectors`
    and :meth:`current_priors` read them (E0's without a block)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (cali_vectors, priors) set by calibrated()
        self._calibration: Optional[Tuple[Tensor, Optional[Tensor]]] = None

    @contextlib.contextmanager
    def calibrated(self,
                   cali_vectors: Tensor,
                   priors: Optional[Tensor] = None) -> Iterator[None]:
        """Calibrate the head's forwards inside the block.

        Args:
            cali_vectors (Tensor): V', (K, d) or (B, K, d) per image.
            priors (Tensor, optional): the priors that gave V', (B, K, K) or
                (K, K), for LoMa in training.
        """
        previous = self._calibration
        self._calibration = (cali_vectors, priors)
        try:
            yield
        finally:
            self._calibration = previous

    def current_cali_vectors(self, like: Tensor) -> Tensor:
        """V' of the :meth:`calibrated` block, else the flat prior E0's."""
        if self._calibration is not None:
            return self._calibration[0]
        return self.get_cali_vectors(self.flat_priors(like))

    def current_priors(self, like: Tensor) -> Tensor:
        """The priors of the :meth:`calibrated` block, else E0."""
        priors = self._calibration[1] if self._calibration else None
        return self.flat_priors(like) if priors is None else priors
