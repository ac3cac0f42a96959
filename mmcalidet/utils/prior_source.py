# Copyright (c) mmcalidet contributors. All rights reserved.
"""Deprecated: moved to :mod:`mmcalidet.priors.prior_source` (kept for one
release; warns once on import).

The priors' loaders live with the priors, so :mod:`mmcalidet.utils` no
longer imports :mod:`mmcalidet.priors` (which imports ``utils``).
"""
from ..priors.prior_source import (describe_prior_source, load_prior_source,
                                   model_classes, training_dataset_classes)
from .deprecation import warn_deprecated

__all__ = [
    'load_prior_source', 'describe_prior_source', 'training_dataset_classes',
    'model_classes'
]

warn_deprecated(__name__, 'mmcalidet.priors.prior_source', skip=(__name__, ))
