# Copyright (c) mmcalidet contributors. All rights reserved.
"""The paper's evaluation protocol on cached decoder outputs (see
docs/user_guides/evaluate.md and self_calibrate.md), one module per step:

* ``methods``: the detectors of a run, their decoder caches, the methods
  (table rows) -- :class:`EvalSetup`;
* ``cache``, ``scoring``: decoder caches and re-scoring under any prior;
* ``feature_cache``, ``head_scoring``, ``dense_outputs``: the same for
  one- and two-stage detectors (cached ``extract_feat`` outputs; what the
  prior does not reach, a dense head or an RPN, run once per image)
  -- :class:`FeatureCache`, :class:`HeadRescorer`;
* ``sweep``: the injection table's priors and evaluation;
* ``partitions``: subsets, sites and self-calibration subsets, each under
  E_t and its own statistics -- :func:`evaluate_partitions`;
* ``self_calibration``, ``online``: Algo. 1, offline and online;
* ``site_prior``: a site's prior fitted from a few labelled images,
  shrunk toward E_t by cross-validation -- :func:`fit_site_prior`;
* ``baselines``, ``coco``, ``report``, ``sensitivity``: post-hoc
  corrections, COCO metrics, tables, V' probes;
* ``protocol``: the steps composed, one function per table (injection,
  sites, deployment, sweep, subsets, self-calibration, online), each
  returning its rows and Markdown -- :class:`ProtocolTable`.
"""
from .baselines import (CORRECTION_NAMES, CORRECTIONS, CooccurrenceRescoring,
                        PriorReweighting, build_correction, class_frequencies)
from .cache import cache_hidden_states, cache_images, image_batches
from .coco import (METRICS, CocoEvaluator, ImageMatches, cache_evaluator,
                   coco_evaluator_from_cfg, paired_bootstrap)
from .feature_cache import FeatureCache
from .head_scoring import HeadRescorer, rescorer_for
from .methods import EvalSetup, input_changes, shares_trunk
from .online import OnlineSelfCalibrator
from .partitions import (SUBSET_SIZES, calibration_subsets, evaluate_groups,
                         evaluate_partitions, evaluate_subsets,
                         read_evaluation_labels, read_image_groups,
                         site_priors, split_subsets, subset_epsilon)
from .protocol import ProtocolTable
from .report import markdown_table, write_report
from .scoring import Rescorer, is_calibratable
from .self_calibration import (DEFAULT_ETA, DEFAULT_SCORE_THR,
                               DEFAULT_TRUST_RADIUS, SelfCalibrationResult,
                               calibration_step, mean_history,
                               prediction_statistics, self_calibrate,
                               self_calibrate_partitions, update_target,
                               within_trust_region)
from .sensitivity import prior_sensitivity
from .site_prior import (SWEEP_ALPHAS, SitePriorFit, deployment_gains,
                         fit_site_prior, mean_interval, shrink,
                         shrinkage_sweep, site_estimate)
from .sweep import (CONTENT_PRIORS, STANDARD_PRIORS, Method, PriorSpec,
                    build_priors, check_expected_order, evaluate_priors,
                    format_order_verdict)

__all__ = [
    'ImageMatches', 'paired_bootstrap', 'SitePriorFit', 'fit_site_prior',
    'SWEEP_ALPHAS', 'shrinkage_sweep',
    'shrink', 'site_estimate', 'deployment_gains', 'mean_interval',
    'EvalSetup', 'shares_trunk', 'input_changes', 'cache_hidden_states',
    'cache_images', 'image_batches', 'Rescorer', 'FeatureCache',
    'HeadRescorer', 'rescorer_for',
    'is_calibratable', 'METRICS', 'CocoEvaluator', 'cache_evaluator',
    'coco_evaluator_from_cfg', 'STANDARD_PRIORS', 'CONTENT_PRIORS',
    'PriorSpec', 'Method', 'build_priors', 'evaluate_priors',
    'check_expected_order', 'format_order_verdict', 'SUBSET_SIZES',
    'split_subsets', 'subset_epsilon', 'calibration_subsets',
    'evaluate_partitions', 'evaluate_groups', 'site_priors',
    'read_image_groups', 'read_evaluation_labels', 'evaluate_subsets',
    'DEFAULT_ETA', 'DEFAULT_SCORE_THR', 'DEFAULT_TRUST_RADIUS',
    'SelfCalibrationResult',
    'prediction_statistics', 'update_target', 'calibration_step',
    'self_calibrate', 'self_calibrate_partitions', 'mean_history',
    'within_trust_region',
    'OnlineSelfCalibrator', 'ProtocolTable', 'CORRECTIONS',
    'CORRECTION_NAMES',
    'PriorReweighting', 'CooccurrenceRescoring', 'build_correction',
    'class_frequencies', 'markdown_table', 'write_report', 'prior_sensitivity'
]
