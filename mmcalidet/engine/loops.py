# Copyright (c) mmcalidet contributors. All rights reserved.
"""Test loops that run the evaluation protocol from a config.

Each loop makes one pass over the test data loader (calling the usual
``before_test_iter`` / ``after_test_iter`` hooks with the predictions under
the model's deployment prior), caches the last decoder layer, and then
re-scores the cache:

* :class:`PriorSweepTestLoop` -- the config's ``test_evaluator`` under each
  prior of the standard table (metrics prefixed by the prior);
* :class:`SubsetEvalTestLoop` -- subset evaluation (E_t vs E_b);
* :class:`SelfCalibrationTestLoop` -- self-calibration on subsets.

One module each (``cached_test_loop.py``, ``prior_sweep_loop.py``,
``subset_eval_loop.py``, ``self_calibration_loop.py``). Use:
``test_cfg = dict(type='PriorSweepTestLoop', priors=[...])`` and
``tools/test.py``. Single process only (the oracle priors need the labels
of the whole evaluation set).
"""
from .cached_test_loop import CachedTestLoop
from .prior_sweep_loop import PriorSweepTestLoop
from .self_calibration_loop import SelfCalibrationTestLoop
from .subset_eval_loop import SubsetEvalTestLoop

__all__ = [
    'CachedTestLoop', 'PriorSweepTestLoop', 'SubsetEvalTestLoop',
    'SelfCalibrationTestLoop'
]
