# Copyright (c) mmcalidet contributors. All rights reserved.
"""LoMa on a softmax box head's probabilities (a candidate of the project
README, "The two-stage calibrator's LoMa").

LoMa is linear in the logits. A softmax box head's cross-entropy does not
hold the target class's logit back, and the CaliFasterRCNN's calibrator
drifts (cross-entropy 0.31 -> 0.83 over its 3,000 updates). Here LoMa acts
on the target class's softmax probability instead: bounded in [0, 1], its
push vanishes as the probability saturates either way.
"""
from mmdet.registry import MODELS
from torch import Tensor

from mmcalidet.models.roi_heads import CaliShared2FCBBoxHead


@MODELS.register_module()
class ProbLoMaShared2FCBBoxHead(CaliShared2FCBBoxHead):
    """``CaliShared2FCBBoxHead`` whose LoMa acts on the K classes' softmax
    probabilities (the background's left out)."""

    def loma_inputs(self, cls_score: Tensor) -> Tensor:
        """The softmax over the K + 1 logits, the K classes' columns.

        Args:
            cls_score (Tensor): (..., K + 1) logits.

        Returns:
            Tensor: (..., K) probabilities.
        """
        return cls_score.softmax(-1)[..., :self.num_classes]
