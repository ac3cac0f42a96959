# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFCOS: FCOS with a run-time calibratable prior."""
from mmdet.models.detectors import FCOS
from mmdet.registry import MODELS

from .calibratable_single_stage import CalibratableSingleStageMixin


@MODELS.register_module()
class CaliFCOS(CalibratableSingleStageMixin, FCOS):
    """FCOS whose classification follows an injected prior E (CaliDet; the
    worked example of ``docs/user_guides/new_baseline.md``).

    The prior plumbing is :class:`CalibratableDetectorMixin`'s; the bbox
    head must be a calibrated dense head such as ``CaliFCOSHead``.

    Args:
        prior (str | PathLike | array-like | dict, optional): the initial
            deployment prior (see :class:`CalibratableDetectorMixin`).
        classes (Sequence[str], optional): the model's class names.
        *args, **kwargs: the arguments of mmdet's ``FCOS``.
    """
