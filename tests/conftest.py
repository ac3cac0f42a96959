# Copyright (c) mmcalidet contributors. All rights reserved.
import os
import os.path as osp
import subprocess
import sys

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


def run_script(script: str, *args: str, cwd: str = ROOT,
               timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a tool under the project's Python, capturing its output."""
    return subprocess.run([sys.executable, osp.join(ROOT, script), *args],
                          cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def run_tool():
    return run_script


@pytest.fixture(autouse=True)
def _keep_light_import_switch():
    """Tools run in-process (runpy) set ``MMCALIDET_LIGHT=1`` for their own
    start-up; restore it so later subprocesses (train.py) import mmcalidet
    in full."""
    before = os.environ.get('MMCALIDET_LIGHT')
    yield
    if before is None:
        os.environ.pop('MMCALIDET_LIGHT', None)
    else:
        os.environ['MMCALIDET_LIGHT'] = before
