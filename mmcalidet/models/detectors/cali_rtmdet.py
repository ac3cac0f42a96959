# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliRTMDet: RTMDet with a run-time calibratable prior."""
from mmdet.models.detectors import RTMDet
from mmdet.registry import MODELS

from .calibratable_single_stage import CalibratableSingleStageMixin


@MODELS.register_module()
class CaliRTMDet(CalibratableSingleStageMixin, RTMDet):
    """RTMDet whose classification follows an injected prior E (CaliDet).

    The prior plumbing (deployment prior, ``set_prior`` / ``get_prior``,
    per-sample priors, the V' cache) is :class:`CalibratableDetectorMixin`;
    the bbox head must be a calibrated dense head such as
    ``CaliRTMDetHead``.

    Args:
        prior (str | PathLike | array-like | dict, optional): the initial
            deployment prior (see :class:`CalibratableDetectorMixin`).
        classes (Sequence[str], optional): the model's class names.
        *args, **kwargs: the arguments of mmdet's ``RTMDet``.
    """
