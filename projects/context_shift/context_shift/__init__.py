# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark: a CPU-sized detection dataset whose
deployment sites shift the class relations (:mod:`.data`), the trainings
of its plain DINO and CaliDINO (:mod:`.training`) and their evaluation
through :mod:`mmcalidet.evaluation` (:mod:`.evaluation`). See the
project's README.md."""
from .data import VARIANTS as DATA_VARIANTS
from .data import make_context_shift, variant_classes
from .evaluation import SITES, claims, evaluate_all, write_results
from .training import (DETECTORS, SCHEDULES, VARIANTS, Training,
                       detector_configs, ensure_data, ran_schedule, schedule,
                       train_both, trained_config, training_settings)

__all__ = [
    'DATA_VARIANTS', 'make_context_shift', 'variant_classes', 'SITES',
    'claims', 'evaluate_all', 'write_results', 'SCHEDULES', 'VARIANTS',
    'Training', 'ensure_data', 'ran_schedule', 'schedule', 'train_both',
    'trained_config', 'training_settings', 'DETECTORS', 'detector_configs'
]
