# Copyright (c) mmcalidet contributors. All rights reserved.
import os
import os.path as osp

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def data_root() -> str:
    """The shared datasets folder (``MMCALIDET_DATA`` or
    ``<project>/../shared/datasets``)."""
    return os.environ.get('MMCALIDET_DATA',
                          osp.join(osp.dirname(ROOT), 'shared', 'datasets'))


@pytest.fixture(scope='session')
def datasets_dir() -> str:
    path = data_root()
    assert osp.isdir(path), (
        f'shared datasets not found at {path}; set MMCALIDET_DATA')
    return path


@pytest.fixture
def run_tool():
    """:func:`testing.run_tool`: a project script under this
    Python with the shared data folder, its output captured."""
    from testing import run_tool as run
    return run


@pytest.fixture(autouse=True)
def _loggers_keep_open_streams():
    """A logger made inside a test that captures output (``capsys``)
    writes to that test's stream, which pytest closes afterwards; mmengine
    keeps its loggers, and the next ``print_log`` of the current one would
    then print a "Logging error" traceback into a later test's stderr.
    After every test, such handlers write to the current stdout."""
    yield
    import logging
    import sys

    from mmengine.logging import MMLogger
    for logger in list(MMLogger._instance_dict.values()):
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(
                    handler.stream, 'closed', False):
                # not setStream: it flushes the closed stream first
                handler.stream = sys.stdout
