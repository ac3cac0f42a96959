# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliFasterRCNN: Faster R-CNN with a run-time calibratable prior."""
from mmdet.models.detectors import FasterRCNN
from mmdet.registry import MODELS

from .calibratable_two_stage import CalibratableTwoStageMixin


@MODELS.register_module()
class CaliFasterRCNN(CalibratableTwoStageMixin, FasterRCNN):
    """Faster R-CNN whose box classification follows an injected prior E
    (CaliDet).

    The prior plumbing (deployment prior, ``set_prior`` / ``get_prior``,
    per-sample priors, the V' cache) is :class:`CalibratableDetectorMixin`;
    the RoI head must be a ``CaliStandardRoIHead`` with a calibrated box
    head such as ``CaliShared2FCBBoxHead``.

    Args:
        prior (str | PathLike | array-like | dict, optional): the initial
            deployment prior (see :class:`CalibratableDetectorMixin`).
        classes (Sequence[str], optional): the model's class names.
        *args, **kwargs: the arguments of mmdet's ``FasterRCNN``.
    """
