# Copyright (c) mmcalidet contributors. All rights reserved.
"""CaliDINO: DINO with a run-time calibratable prior."""
from mmdet.models.detectors import DINO
from mmdet.registry import MODELS

from .calibratable_detr import CalibratableDETRMixin


@MODELS.register_module()
class CaliDINO(CalibratableDETRMixin, DINO):
    """DINO whose classification follows an injected prior E (CaliDet).

    The prior plumbing (deployment prior, ``set_prior`` / ``get_prior``,
    per-sample priors, the V' cache) is :class:`CalibratableDETRMixin`;
    the bbox head must be a calibrated head such as ``CaliDINOHead``.

    Args:
        prior (str | PathLike | array-like | dict, optional): the initial
            deployment prior: a prior file, the name of a shipped prior
            (e.g. ``'coco2017_train'``) or a K x K matrix. ``None`` gives
            the flat prior E0. A checkpoint's ``prior`` replaces it on load.
        classes (Sequence[str], optional): the model's class names, to
            reorder named prior files when the model has no
            ``dataset_meta``.
        *args, **kwargs: the arguments of mmdet's ``DINO``.
    """
