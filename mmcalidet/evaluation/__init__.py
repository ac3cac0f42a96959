# Copyright (c) mmcalidet contributors. All rights reserved.
"""The paper's evaluation protocol on cached decoder outputs (see
docs/user_guides/evaluate.md), one module per step:

* ``methods``: the detectors of a run, their decoder caches, the methods
  (table rows) -- :class:`EvalSetup`;
* ``cache``, ``scoring``: decoder caches and re-scoring under any prior;
* ``feature_cache``, ``head_scoring``, ``dense_outputs``: the same for
  one- and two-stage detectors (cached ``extract_feat`` outputs; what the
  prior does not reach, a dense head or an RPN, run once per image)
  -- :class:`FeatureCache`, :class:`HeadRescorer`;
* ``sweep``: the injection table's priors (kinds of
  :mod:`mmcalidet.priors.kinds`) and evaluation;
* ``partitions``, ``image_labels``: subsets, sites and self-calibration
  subsets, each under E_t and its own statistics --
  :func:`evaluate_partitions`; their labels and groups read from files;
* ``split_half``: site tables whose statistics come from the site's other
  half (each half its own AP, the halves' gains averaged, a paired
  bootstrap interval each) -- :func:`evaluate_site_halves`;
* ``site_sweep``: a site's prior swept from E_t past its statistics;
* ``coco``, ``image_matches``, ``bootstrap`` (on ``fast_cocoeval``,
  ``coco_matches``): COCO metrics, per-image matches, paired bootstrap
  intervals;
* ``baselines``, ``report``, ``sensitivity``: post-hoc corrections,
  tables, V' probes;
* ``protocol``: the steps composed, one function per table (injection,
  sites, deployment, sweep, subsets, self-calibration, online), each
  returning its rows and Markdown (``protocol.ProtocolTable``); the one
  module that imports :mod:`mmcalidet.calibration` (a site prior fitted,
  self-calibration), so it is imported by name: ``from
  mmcalidet.evaluation import protocol``.
"""
from .baselines import (CORRECTION_NAMES, CORRECTIONS, CooccurrenceRescoring,
                        PriorReweighting, build_correction, class_frequencies)
from .bootstrap import mean_interval, paired_bootstrap
from .cache import cache_hidden_states, cache_images, image_batches
from .coco import (METRICS, CocoEvaluator, cache_evaluator,
                   coco_evaluator_from_cfg)
from .feature_cache import FeatureCache
from .head_scoring import HeadRescorer, rescorer_for
from .image_labels import read_evaluation_labels, read_image_groups
from .image_matches import ImageMatches
from .methods import EvalSetup, input_changes, shares_trunk
from .partitions import (SUBSET_SIZES, calibration_subsets, check_subset_sizes,
                         evaluate_groups, evaluate_partitions,
                         evaluate_subsets, site_priors, split_subsets,
                         subset_epsilon)
from .report import format_order_verdict, markdown_table, write_report
from .scoring import Rescorer, is_calibratable
from .sensitivity import prior_sensitivity
from .site_sweep import SWEEP_ALPHAS, shrinkage_sweep, split_half_sweep
from .split_half import (IN_SAMPLE, INTERVAL_LEVEL, SPLIT_HALF,
                         evaluate_site_halves, relation_classes, site_halves,
                         split_halves)
from .sweep import (CONTENT_PRIORS, STANDARD_PRIORS, Method, PriorSpec,
                    build_priors, check_expected_order, evaluate_priors)

__all__ = [
    'EvalSetup', 'shares_trunk', 'input_changes', 'cache_hidden_states',
    'cache_images', 'image_batches', 'Rescorer', 'is_calibratable',
    'FeatureCache', 'HeadRescorer', 'rescorer_for', 'STANDARD_PRIORS',
    'CONTENT_PRIORS', 'PriorSpec', 'Method', 'build_priors', 'evaluate_priors',
    'check_expected_order', 'format_order_verdict', 'SUBSET_SIZES',
    'split_subsets', 'subset_epsilon', 'calibration_subsets',
    'check_subset_sizes', 'evaluate_partitions', 'evaluate_groups',
    'evaluate_subsets', 'site_priors', 'read_image_groups',
    'read_evaluation_labels', 'SWEEP_ALPHAS', 'shrinkage_sweep',
    'split_half_sweep', 'IN_SAMPLE', 'SPLIT_HALF', 'INTERVAL_LEVEL',
    'evaluate_site_halves', 'site_halves', 'split_halves', 'relation_classes',
    'METRICS', 'CocoEvaluator', 'cache_evaluator', 'coco_evaluator_from_cfg',
    'ImageMatches', 'paired_bootstrap', 'mean_interval', 'CORRECTIONS',
    'CORRECTION_NAMES', 'PriorReweighting', 'CooccurrenceRescoring',
    'build_correction', 'class_frequencies', 'markdown_table', 'write_report',
    'prior_sensitivity'
]
