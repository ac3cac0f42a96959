# Copyright (c) mmcalidet contributors. All rights reserved.
"""Relation statistics, prior files, the priors a config or user gives and
the prior kinds an evaluation builds (see docs/user_guides/priors.md).

Light: imported with ``MMCALIDET_LIGHT=1`` (see mmcalidet/__init__.py), so
its modules import nothing heavier than numpy at the top (torch, mmengine
and mmdet only inside the functions that need them).
"""
from .checks import check_class_names, reorder_prior, validate_prior
from .kinds import (PRIOR_KINDS, KindInputs, PriorKind, get_prior_kind,
                    prior_label, register_prior_kind)
from .prior import Prior
from .prior_io import default_prior_path, save_prior
from .prior_source import (describe_prior_source, load_prior,
                           load_prior_source, model_classes,
                           training_dataset_classes)
from .shrinkage import shrink, site_estimate
from .statistics import (batch_prior, cooccurrence_counts, counts_to_prior,
                         flat_prior, flip_prior, label_lists_prior,
                         prior_from_flat, prior_mae, sample_prior)

__all__ = [
    'Prior', 'flat_prior', 'sample_prior', 'batch_prior', 'flip_prior',
    'prior_from_flat', 'cooccurrence_counts', 'counts_to_prior',
    'label_lists_prior', 'prior_mae', 'load_prior', 'save_prior',
    'validate_prior', 'reorder_prior', 'check_class_names',
    'default_prior_path', 'load_prior_source', 'describe_prior_source',
    'model_classes', 'training_dataset_classes', 'PRIOR_KINDS', 'PriorKind',
    'KindInputs', 'register_prior_kind', 'get_prior_kind', 'prior_label',
    'shrink', 'site_estimate'
]
