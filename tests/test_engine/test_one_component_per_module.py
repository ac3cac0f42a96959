# Copyright (c) mmcalidet contributors. All rights reserved.
"""Each engine module registers at most one hook or loop, and the modules
configs import (``checkpoint_hooks``, ``loops``) still register them all."""
import ast
import glob
import os.path as osp

from mmdet.registry import HOOKS, LOOPS

import mmcalidet.engine.checkpoint_hooks  # noqa: F401
import mmcalidet.engine.loops  # noqa: F401
from testing import PROJECT_ROOT


def registered_in(path: str) -> list:
    """The classes of a module decorated with ``HOOKS``/``LOOPS``'s
    ``register_module``."""
    tree = ast.parse(open(path).read())
    names = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for dec in node.decorator_list:
            call = dec.func if isinstance(dec, ast.Call) else dec
            if (isinstance(call, ast.Attribute)
                    and call.attr == 'register_module'
                    and getattr(call.value, 'id', '') in ('HOOKS', 'LOOPS')):
                names.append(node.name)
    return names


def test_each_module_registers_one_hook_or_loop_at_most():
    found = {}
    for path in glob.glob(
            osp.join(PROJECT_ROOT, 'mmcalidet', 'engine', '*.py')):
        names = registered_in(path)
        assert len(names) <= 1, (path, names)
        found.update({name: path for name in names})
    for name in ('AtomicCheckpointHook', 'IterationSeedHook',
                 'CheckpointCompatHook', 'SnapshotHook',
                 'OnlineSelfCalibrationHook'):
        assert name in found and HOOKS.get(name) is not None, name
    for name in ('PriorSweepTestLoop', 'SubsetEvalTestLoop',
                 'SelfCalibrationTestLoop'):
        assert name in found and LOOPS.get(name) is not None, name
