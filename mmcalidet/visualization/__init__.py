# Copyright (c) mmcalidet contributors. All rights reserved.
from .prior_heatmap import plot_prior, plot_prior_comparison

__all__ = ['plot_prior', 'plot_prior_comparison']
