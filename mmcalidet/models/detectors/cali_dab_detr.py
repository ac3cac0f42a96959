# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDABDETR: DAB-DETR with a run-time calibratable prior."""
from mmdet.models.detectors import DABDETR
from mmdet.registry import MODELS

from .calibratable_detr import CalibratableDETRMixin


@MODELS.register_module()
class CaliDABDETR(CalibratableDETRMixin, DABDETR):
    """DAB-DETR whose classification follows an injected prior E (the
    worked example of ``docs/user_guides/new_baseline.md``); the bbox head
    must be a calibrated head such as ``CaliDABDETRHead``.

    Args:
        prior, classes: see :class:`CalibratableDetectorMixin`.
        *args, **kwargs: the arguments of mmdet's ``DABDETR``.
    """
