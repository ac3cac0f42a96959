# Copyright (c) mmcalidet contributors. All rights reserved.
"""Relation statistics and prior files (see docs/user_guides/priors.md)."""
from .prior_io import (check_class_names, default_prior_path, load_prior,
                       reorder_prior, save_prior, validate_prior)
from .statistics import (batch_prior, cooccurrence_counts, counts_to_prior,
                         flat_prior, flip_prior, label_lists_prior,
                         prior_from_flat, prior_mae, sample_prior)

__all__ = [
    'flat_prior', 'sample_prior', 'batch_prior', 'flip_prior',
    'prior_from_flat', 'cooccurrence_counts', 'counts_to_prior',
    'label_lists_prior', 'prior_mae', 'load_prior', 'save_prior',
    'validate_prior', 'reorder_prior', 'check_class_names',
    'default_prior_path'
]
