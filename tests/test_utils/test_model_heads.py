# Copyright (c) mmcalidet contributors. All rights reserved.
"""``classifying_head``: a DETR's or one-stage detector's ``bbox_head``, a
two-stage detector's box head, ``None`` for a model with neither."""
from types import SimpleNamespace

from mmcalidet.utils.model_heads import classifying_head


def test_the_head_of_each_kind_of_detector():
    dense = SimpleNamespace(num_classes=3)
    box = SimpleNamespace(num_classes=5)
    assert classifying_head(SimpleNamespace(bbox_head=dense)) is dense
    two_stage = SimpleNamespace(
        rpn_head=object(), roi_head=SimpleNamespace(bbox_head=box))
    assert classifying_head(two_stage) is box
    assert classifying_head(SimpleNamespace(roi_head=object())) is None
    assert classifying_head(object()) is None
