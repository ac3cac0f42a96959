# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmengine components registered in mmdet's ``LOOPS`` / ``HOOKS``: the
evaluation protocol's test loops (``loops.py``), online self-calibration
(``self_calibration_hook.py``), safe checkpointing (``checkpoint_hooks.py``
imports its three hooks, one module each), the training classes that a
model's named priors are matched to (``prior_classes_hook.py``), the seed
a resumed run restores
(``run_seed.py``), snapshots at chosen iterations
(``snapshot_hook.py``) and the optimizer wrappers' parts
(``merged_groups_optim.py``, ``fused_clip_optim.py``,
``calibrator_optim.py``) and the iteration-based training loop of the CPU
configs (``iter_train_loop.py``)."""
from .calibrator_optim import CalibratorOptimWrapperConstructor
from .checkpoint_hooks import (AtomicCheckpointHook, CheckpointCompatHook,
                               IterationSeedHook)
from .fused_clip_optim import FusedClipOptimWrapper, total_grad_norm
from .iter_train_loop import PromptIterBasedTrainLoop
from .loops import (CachedTestLoop, PriorSweepTestLoop,
                    SelfCalibrationTestLoop, SubsetEvalTestLoop)
from .merged_groups_optim import (MergedGroupsOptimWrapperConstructor,
                                  merge_param_groups)
from .prior_classes_hook import PriorClassesHook
from .run_seed import checkpoint_to_resume, restore_run_seed
from .self_calibration_hook import OnlineSelfCalibrationHook
from .snapshot_hook import SnapshotHook

__all__ = [
    'CachedTestLoop', 'PriorSweepTestLoop', 'SubsetEvalTestLoop',
    'SelfCalibrationTestLoop', 'OnlineSelfCalibrationHook',
    'AtomicCheckpointHook', 'IterationSeedHook', 'CheckpointCompatHook',
    'SnapshotHook', 'CalibratorOptimWrapperConstructor', 'restore_run_seed',
    'checkpoint_to_resume', 'MergedGroupsOptimWrapperConstructor',
    'merge_param_groups', 'PriorClassesHook', 'FusedClipOptimWrapper',
    'total_grad_norm', 'PromptIterBasedTrainLoop'
]
