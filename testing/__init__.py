# Copyright (c) mmcalidet contributors. All rights reserved.
"""Helpers of the repository's tests and benchmarks (configs, real data,
demo batches, running tools): tests/, projects/*/tests and benchmarks/
import them from the source checkout; they are not part of the installed
package (setup.py ships ``mmcalidet`` alone)."""
from ._utils import (PROJECT_ROOT, brute_force_prior, build_detector,
                     captured_log, coco_mini_label_lists, damage_cache_file,
                     data_root, demo_batch, eval_inputs, get_config,
                     known_scores_setup, match_config_classes, popen_tool,
                     random_label_lists, random_prior, run_tool,
                     run_tool_in_process, save_coco_mini_prior,
                     set_known_scores, train_steps)
from .detector_checks import (check_bad_priors_refused,
                              check_califormer_trains, check_inference_priors)
from .logging_state import logging_restored

__all__ = [
    'match_config_classes', 'known_scores_setup',
    'PROJECT_ROOT', 'data_root', 'get_config', 'coco_mini_label_lists',
    'save_coco_mini_prior', 'demo_batch', 'train_steps', 'build_detector',
    'random_prior', 'eval_inputs', 'set_known_scores', 'run_tool',
    'run_tool_in_process', 'popen_tool', 'random_label_lists',
    'brute_force_prior',
    'captured_log', 'damage_cache_file', 'check_bad_priors_refused',
    'check_inference_priors', 'check_califormer_trains', 'logging_restored'
]
