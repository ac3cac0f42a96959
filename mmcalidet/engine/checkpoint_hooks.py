# Copyright (c) mmcalidet contributors. All rights reserved.
"""Hooks for checkpoints that survive a kill and resume exactly, one module
each; configs import this module to register the three:

- :class:`AtomicCheckpointHook` (``atomic_checkpoint_hook.py``): a kill
  while saving leaves the previous checkpoint and a valid
  ``last_checkpoint``;
- :class:`IterationSeedHook` (``iteration_seed_hook.py``): a resumed run
  draws the numbers the uninterrupted one drew;
- :class:`CheckpointCompatHook` (``checkpoint_compat_hook.py``): says what of
  a checkpoint does not fit the model before mmengine loads it.

Configs use them with::

    custom_imports = dict(
        imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
        allow_failed_imports=False)
    default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
    custom_hooks = [dict(type='IterationSeedHook')]
"""
from .atomic_checkpoint_hook import (ATOMIC_BACKEND, AtomicCheckpointHook,
                                     AtomicLocalBackend)
from .checkpoint_compat_hook import CheckpointCompatHook
from .iteration_seed_hook import (IterationSeedHook, iteration_seed,
                                  seed_everything)

__all__ = [
    'AtomicCheckpointHook', 'AtomicLocalBackend', 'ATOMIC_BACKEND',
    'IterationSeedHook', 'iteration_seed', 'seed_everything',
    'CheckpointCompatHook'
]
