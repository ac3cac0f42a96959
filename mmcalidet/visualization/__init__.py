# Copyright (c) mmcalidet contributors. All rights reserved.
from .calibration_curves import (plot_prior_sweep, plot_self_calibration,
                                 plot_shrinkage_sweep, plot_site_results,
                                 plot_subset_results)
from .prior_heatmap import plot_prior, plot_prior_comparison

__all__ = [
    'plot_prior', 'plot_prior_comparison', 'plot_self_calibration',
    'plot_prior_sweep', 'plot_shrinkage_sweep', 'plot_site_results',
    'plot_subset_results'
]
