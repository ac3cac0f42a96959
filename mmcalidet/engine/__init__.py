# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmengine components registered in mmdet's ``LOOPS`` / ``HOOKS``: the
evaluation protocol's test loops (``loops.py``), online self-calibration
(``self_calibration_hook.py``) and safe checkpointing
(``checkpoint_hooks.py``)."""
from .checkpoint_hooks import (AtomicCheckpointHook, CheckpointCompatHook,
                               IterationSeedHook)
from .loops import (CachedTestLoop, PriorSweepTestLoop,
                    SelfCalibrationTestLoop, SubsetEvalTestLoop)
from .self_calibration_hook import OnlineSelfCalibrationHook

__all__ = [
    'CachedTestLoop', 'PriorSweepTestLoop', 'SubsetEvalTestLoop',
    'SelfCalibrationTestLoop', 'OnlineSelfCalibrationHook',
    'AtomicCheckpointHook', 'IterationSeedHook', 'CheckpointCompatHook'
]
