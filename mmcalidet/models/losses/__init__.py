# Copyright (c) mmcalidet contributors. All rights reserved.
from .loma_head import LoMaMixin
from .loma_loss import LoMaLoss, loma_class_weights
from .loma_queries import LoMaQueriesMixin

__all__ = ['LoMaLoss', 'loma_class_weights', 'LoMaMixin', 'LoMaQueriesMixin']
