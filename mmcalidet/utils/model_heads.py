# Copyright (c) mmcalidet contributors. All rights reserved.
"""Find a detector's classifying head, whatever its kind."""
from typing import Any, Optional


def classifying_head(model: Any) -> Optional[Any]:
    """The head whose classifier scores the K classes: a DETR's or a
    one-stage detector's ``bbox_head``, a two-stage detector's box head
    (``roi_head.bbox_head``).

    Args:
        model: a detector (CaliDet or plain).

    Returns:
        nn.Module | None: the head; ``None`` for a model with neither.
    """
    head = getattr(model, 'bbox_head', None)
    if head is None:
        head = getattr(getattr(model, 'roi_head', None), 'bbox_head', None)
    return head
