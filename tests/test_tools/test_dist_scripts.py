# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/dist_train.sh picks the project's .venv/bin/python by default (a
system python has no torch), ``PYTHON`` when set, else ``python``."""
import os
import os.path as osp
import shutil
import stat
import subprocess

import pytest

from testing import PROJECT_ROOT

pytestmark = pytest.mark.slow

FAKE = """#!/usr/bin/env bash
echo "{name} $*"
"""


def fake_python(path, name):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(FAKE.format(name=name))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def run(root, **env):
    env = dict(os.environ, **env)  # PYTHON='': not set
    return subprocess.run(['bash',
                           str(root / 'tools' / 'dist_train.sh'), 'cfg.py',
                           '2', '--work-dir', 'w'],
                          env=env,
                          capture_output=True,
                          text=True,
                          check=True).stdout


def test_dist_train_defaults_to_the_project_venv(tmp_path):
    root = tmp_path / 'project'
    (root / 'tools').mkdir(parents=True)
    shutil.copy(
        osp.join(PROJECT_ROOT, 'tools', 'dist_train.sh'), root / 'tools')
    bin_dir = tmp_path / 'bin'
    fake_python(str(bin_dir / 'python'), 'path-python')
    path = f'{bin_dir}{os.pathsep}{os.environ["PATH"]}'
    # no venv: python on the PATH
    out = run(root, PATH=path, PYTHON='')
    assert out.startswith('path-python -m torch.distributed.run ')
    # the project's venv
    fake_python(str(root / '.venv' / 'bin' / 'python'), 'venv-python')
    out = run(root, PATH=path, PYTHON='')
    assert out.startswith('venv-python -m torch.distributed.run ')
    assert '--nproc_per_node=2' in out
    assert out.rstrip().endswith(
        f'{root}/tools/train.py cfg.py --launcher pytorch --work-dir w')
    # PYTHON wins
    fake_python(str(tmp_path / 'other'), 'other-python')
    out = run(root, PATH=path, PYTHON=str(tmp_path / 'other'))
    assert out.startswith('other-python -m torch.distributed.run ')
