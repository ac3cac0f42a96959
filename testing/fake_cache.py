# Copyright (c) mmcalidet contributors. All rights reserved.
"""A stand-in for a decoder cache in evaluation tests: its images'
``(img_id, boxes, labels)`` and nothing a model computed."""
from typing import List, Sequence, Tuple

import numpy as np


class FakeCache:
    """The parts of a decoder cache the site and split-half tables read.

    Args:
        images (Sequence[tuple]): per image ``(img_id, boxes, labels)``.
    """

    def __init__(self, images: Sequence[Tuple]) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def gt_label_lists(self) -> List[np.ndarray]:
        return [np.unique(labels) for _, _, labels in self.images]

    def img_ids(self) -> list:
        return [img_id for img_id, _, _ in self.images]
