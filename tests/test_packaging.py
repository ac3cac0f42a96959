# Copyright (c) mmcalidet contributors. All rights reserved.
"""The package's own installation and its dependency check (the exact
versions installed are tools/setup_env.sh's and requirements/' concern)."""
import os
import os.path as osp
import platform
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


def test_cython_extensions_compiled():
    from mmcalidet.models.layers import _deform_attn_cpu
    from mmcalidet.priors import _cooccurrence
    assert _cooccurrence.__file__.endswith('.so')
    assert _deform_attn_cpu.__file__.endswith('.so')
    if platform.machine().lower() in ('x86_64', 'amd64'):
        from mmcalidet.models.layers import _deform_attn_cpu_avx2
        assert _deform_attn_cpu_avx2.__file__.endswith('.so')


def test_mim_folder_links_tools_configs_and_model_index():
    import mmcalidet
    mim = osp.join(osp.dirname(mmcalidet.__file__), '.mim')
    for name in ('tools', 'configs', 'model-index.yml'):
        assert osp.realpath(osp.join(mim, name)) == osp.join(ROOT, name)
    assert osp.isfile(osp.join(mim, 'tools', 'analysis_tools',
                               'compute_prior.py'))


def test_version_check_rejects_unsupported_and_warns(monkeypatch):
    """The check's logic on made-up versions: whatever is installed, a
    version outside mmdet's range refuses, an untested one warns, the
    tested stack passes silently and a missing package refuses."""
    tested = {
        'torch': '9.1.0',
        'mmengine': '0.10.0',
        'mmcv': '2.1.5',
        'mmdet': '3.2.0'
    }
    monkeypatch.setattr(version_check, 'TESTED', tested)

    def installed(**changes):
        versions = dict(tested, **changes)

        def version(name):
            if versions.get(name) is None:
                raise metadata.PackageNotFoundError(name)
            return versions[name]

        monkeypatch.setattr(version_check.metadata, 'version', version)

    def warnings_of_check():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            version_check.check_dependency_versions()
        return [str(w.message) for w in caught]

    installed()
    assert warnings_of_check() == []
    # a local build tag (+cpu) is the tested version
    installed(torch='9.1.0+cpu')
    assert warnings_of_check() == []
    # outside mmdet 3.x's ranges (mmcv < 2.2, mmdet < 4, mmengine >= 0.7.1)
    for name, version in (('mmcv', '2.2.0'), ('mmcv', '1.7.2'),
                          ('mmdet', '4.0.0'), ('mmengine', '0.7.0')):
        installed(**{name: version})
        with pytest.raises(
                ImportError, match=f'{name}=={version} is not supported'):
            version_check.check_dependency_versions()
    # inside the range but not the tested version: one warning naming both
    installed(torch='2.4.0')
    messages = warnings_of_check()
    assert len(messages) == 1
    assert 'torch==9.1.0' in messages[0] and '2.4.0' in messages[0]
    installed(mmcv='2.0.1')
    messages = warnings_of_check()
    assert len(messages) == 1 and 'mmcv==2.1.5' in messages[0]
    installed(mmdet=None)
    with pytest.raises(ImportError, match='needs mmdet'):
        version_check.check_dependency_versions()


@pytest.mark.slow
def test_light_import_skips_torch():
    # the label converters' modules too (tools/dataset_converters/)
    code = ('import os, sys; os.environ["MMCALIDET_LIGHT"] = "1"; '
            'import mmcalidet.priors, mmcalidet.datasets.yolo_to_coco; '
            'print("torch" in sys.modules, "mmdet" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ['False', 'False']


@pytest.mark.slow
def test_train_help_loads_neither_torch_nor_mmdet():
    """``mim train`` runs ``tools/train.py -h`` (through the .mim link)
    before every training: its help comes before the heavy imports."""
    code = ('import runpy, sys; sys.argv = ["train.py", "-h"]\n'
            'try:\n'
            f'    runpy.run_path({osp.join(ROOT, "tools", "train.py")!r}, '
            'run_name="__main__")\n'
            'except SystemExit as e:\n'
            '    print("exit", e.code, "torch" in sys.modules, '
            '"mmdet" in sys.modules)\n')
    out = subprocess.run([sys.executable, '-c', code],
                         capture_output=True,
                         text=True,
                         check=True).stdout
    assert '--cfg-options' in out and '--launcher' in out
    assert out.strip().endswith('exit 0 False False'), out


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
    # what the wheel holds, not how fast its code runs: compiled at -O0
    env = dict(os.environ, MMCALIDET_EXT_OPT='-O0')
    res = subprocess.run([
        sys.executable, '-m', 'pip', 'wheel', '--no-deps',
        '--no-build-isolation', '-q', '-w',
        str(tmp_path / 'dist'),
        str(src)
    ], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel, = (tmp_path / 'dist').glob('mmcalidet-*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    modules = ['priors/_cooccurrence.', 'models/layers/_deform_attn_cpu.']
    if platform.machine().lower() in ('x86_64', 'amd64'):
        modules.append('models/layers/_deform_attn_cpu_avx2.')
    for module in modules:
        assert any(n.startswith(f'mmcalidet/{module}') and n.endswith('.so')
                   for n in names), module
    for path in ('mmcalidet/data/priors/coco2017_train.json',
                 'mmcalidet/.mim/tools/train.py',
                 'mmcalidet/.mim/tools/analysis_tools/compute_prior.py',
                 # the shared config fragments the configs list as bases
                 'mmcalidet/.mim/configs/_base_/calidet.py',
                 'mmcalidet/.mim/configs/_base_/datasets/coco-mini.py',
                 'mmcalidet/.mim/configs/_base_/schedules/tiny.py',
                 # the model index mim searches, and the metafile it lists
                 'mmcalidet/.mim/model-index.yml',
                 'mmcalidet/.mim/configs/calidet/metafile.yml'):
        assert path in names, path
    assert any(n.startswith('mmcalidet/.mim/configs/') and n.endswith('.py')
               for n in names)
    # the package alone: no test helper, no other top-level folder
    tops = {n.split('/', 1)[0] for n in names}
    assert {t for t in tops if not t.endswith('.dist-info')} == {'mmcalidet'}
    assert not [n for n in names if n.startswith('mmcalidet/testing/')]
