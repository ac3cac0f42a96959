# Copyright (c) mmcalidet contributors. All rights reserved.
"""The installed stack and the package's own installation."""
import os.path as osp
import subprocess
import sys
import warnings
from importlib import metadata

import pytest

from mmcalidet.utils import version_check

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_mmcv_ops_available():
    from mmcv.ops import MultiScaleDeformableAttention
    assert MultiScaleDeformableAttention is not None


def test_pinned_stack_installed():
    for name, version in version_check.TESTED.items():
        assert metadata.version(name).split('+')[0] == version, name


def test_cython_extension_compiled():
    from mmcalidet.priors import _cooccurrence
    assert _cooccurrence.__file__.endswith('.so')


def test_mim_folder_links_tools_and_configs():
    import mmcalidet
    mim = osp.join(osp.dirname(mmcalidet.__file__), '.mim')
    for name in ('tools', 'configs'):
        assert osp.realpath(osp.join(mim, name)) == osp.join(ROOT, name)
    assert osp.isfile(osp.join(mim, 'tools', 'analysis_tools',
                               'compute_prior.py'))


def test_version_check_rejects_unsupported_and_warns(monkeypatch):
    real = metadata.version

    def fake(versions):
        return lambda name: versions.get(name) or real(name)

    monkeypatch.setattr(version_check.metadata, 'version',
                        fake({'mmcv': '2.2.0'}))
    with pytest.raises(ImportError, match='mmcv==2.2.0 is not supported'):
        version_check.check_dependency_versions()
    monkeypatch.setattr(version_check.metadata, 'version',
                        fake({'torch': '2.4.0'}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        version_check.check_dependency_versions()
    assert any('torch==2.13.0, found 2.4.0' in str(w.message)
               for w in caught)

    def missing(name):
        if name == 'mmdet':
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(version_check.metadata, 'version', missing)
    with pytest.raises(ImportError, match='needs mmdet'):
        version_check.check_dependency_versions()


def test_light_import_skips_torch():
    code = ('import os, sys; os.environ["MMCALIDET_LIGHT"] = "1"; '
            'import mmcalidet.priors; '
            'print("torch" in sys.modules, "mmdet" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ['False', 'False']


def test_regular_wheel_ships_tools_configs_priors_and_extension(tmp_path):
    """``pip install .`` (not editable) must carry what ``mim`` and users
    need: the compiled core, the shipped priors and copies of tools/ and
    configs/ under mmcalidet/.mim. Built from a copy of the tree so the
    editable install's links stay untouched."""
    import shutil
    import zipfile
    src = tmp_path / 'src'
    everywhere = shutil.ignore_patterns('.mim', '*.so', '__pycache__',
                                        '*.egg-info')
    # at the top: the environment, generated data and runs (the benchmark's
    # data/ holds hundreds of MB of images on a machine that ran it)
    top = {'.venv', '.git', 'build', 'dist', 'data', 'outputs', 'work_dirs'}

    def ignore(folder, names):
        skipped = set(everywhere(folder, names))
        if osp.samefile(folder, ROOT):
            skipped |= top & set(names)
        return skipped

    shutil.copytree(ROOT, src, ignore=ignore)
    res = subprocess.run([
        sys.executable, '-m', 'pip', 'wheel', '--no-deps',
        '--no-build-isolation', '-q', '-w',
        str(tmp_path / 'dist'),
        str(src)
    ], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel, = (tmp_path / 'dist').glob('mmcalidet-*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith('mmcalidet/priors/_cooccurrence')
               and n.endswith('.so') for n in names)
    for path in ('mmcalidet/data/priors/coco2017_train.json',
                 'mmcalidet/.mim/tools/train.py',
                 'mmcalidet/.mim/tools/analysis_tools/compute_prior.py',
                 # the shared config fragments the configs list as bases
                 'mmcalidet/.mim/configs/_base_/calidet.py',
                 'mmcalidet/.mim/configs/_base_/datasets/coco-mini.py',
                 'mmcalidet/.mim/configs/_base_/schedules/tiny.py'):
        assert path in names, path
    assert any(n.startswith('mmcalidet/.mim/configs/') and n.endswith('.py')
               for n in names)
