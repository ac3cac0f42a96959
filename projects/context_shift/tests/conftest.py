# Copyright (c) mmcalidet contributors. All rights reserved.
"""The project's tests run from the repository root (``python -m pytest``
puts it on ``sys.path``); the tools they start find the project through
``PYTHONPATH``, as a user's shell does."""
import os
import os.path as osp

import pytest

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
os.environ['PYTHONPATH'] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
              if p])


@pytest.fixture
def run_tool():
    """:func:`mmcalidet.testing.run_tool`: a script under this Python, its
    output captured."""
    from mmcalidet.testing import run_tool as run
    return run
