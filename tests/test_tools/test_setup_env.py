# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/setup_env.sh's choice of a CPU or CUDA mmcv build, checked through
its functions (sourcing the script defines them and installs nothing)."""
import os
import os.path as osp
import shutil
import stat
import subprocess
import sys

import pytest

from testing import PROJECT_ROOT

pytestmark = pytest.mark.slow

SCRIPT = osp.join(PROJECT_ROOT, 'tools', 'setup_env.sh')
SYSTEM_NVCC = '/usr/local/cuda/bin/nvcc'
BASH = shutil.which('bash')


def executable(path, text):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return str(path)


def call(expr, **env):
    """Source the script, then run ``expr``; its stdout."""
    env = dict(
        {
            k: v
            for k, v in os.environ.items()
            if k not in ('CUDA_HOME', 'MMCALIDET_CPU_ONLY')
        }, **env)
    return subprocess.run([BASH, '-c', f'source "{SCRIPT}" && {expr}'],
                          env=env,
                          capture_output=True,
                          text=True,
                          check=True).stdout.strip()


def test_setup_env_syntax_and_sourcing_installs_nothing(tmp_path):
    subprocess.run([BASH, '-n', SCRIPT], check=True)
    venv = tmp_path / 'venv'
    assert call('echo sourced', MMCALIDET_VENV=str(venv),
                MMCALIDET_CACHE=str(tmp_path / 'cache')) == 'sourced'
    assert not venv.exists() and not (tmp_path / 'cache').exists()


def test_cuda_build_needs_nvcc_and_a_cuda_torch(tmp_path):
    bin_dir = tmp_path / 'bin'
    cuda_torch = executable(bin_dir / 'cuda-python', '#!/bin/sh\necho 12.6\n')
    cpu_torch = executable(bin_dir / 'cpu-python', '#!/bin/sh\necho\n')
    no_nvcc = str(bin_dir)  # the fakes need nothing on the PATH
    # no CUDA toolkit: the CPU build, whatever torch is
    if not osp.exists(SYSTEM_NVCC):
        assert call(f'find_nvcc; mmcv_cuda_tag {cuda_torch}',
                    PATH=no_nvcc) == ''
    # nvcc on the PATH
    nvcc = executable(tmp_path / 'cuda' / 'bin' / 'nvcc', '#!/bin/sh\n')
    path = f'{osp.dirname(nvcc)}{os.pathsep}{no_nvcc}'
    assert call('find_nvcc', PATH=path) == nvcc
    assert call(f'mmcv_cuda_tag {cuda_torch}', PATH=path) == 'cu126'
    # a CPU torch (this venv's real one included): the CPU build
    assert call(f'mmcv_cuda_tag {cpu_torch}', PATH=path) == ''
    import torch
    if torch.version.cuda is None:
        assert call(f'mmcv_cuda_tag {sys.executable}', PATH=path) == ''
    # forced off
    assert call(
        f'mmcv_cuda_tag {cuda_torch}', PATH=path,
        MMCALIDET_CPU_ONLY='1') == ''
    # CUDA_HOME's nvcc wins
    other = executable(tmp_path / 'other' / 'bin' / 'nvcc', '#!/bin/sh\n')
    assert call(
        'find_nvcc', PATH=path, CUDA_HOME=str(tmp_path / 'other')) == other


def test_cuda_wheels_are_cached_apart():
    assert call('mmcv_wheel_dir /c 2.13.0 cp311 ""') == \
        '/c/torch-2.13.0-cp311'  # the CPU folder, as before
    assert call('mmcv_wheel_dir /c 2.13.0 cp311 cu126') == \
        '/c/torch-2.13.0-cu126-cp311'


def test_logged_steps_keep_their_output_in_the_log(tmp_path):
    log = tmp_path / 'setup.log'
    env = dict(os.environ, SETUP_LOG=str(log))
    ok = subprocess.run(
        [BASH, '-c', f'source "{SCRIPT}" && logged echo pip-says-hello'],
        env=env, capture_output=True, text=True)
    assert ok.returncode == 0
    assert ok.stdout == '' and ok.stderr == ''
    assert 'pip-says-hello' in log.read_text()
    bad = subprocess.run([
        BASH, '-c', f'source "{SCRIPT}" && '
        'logged sh -c "echo the-reason; exit 3"; echo status=$?'
    ],
                         env=env,
                         capture_output=True,
                         text=True)
    # the failure is said, with the log's end, and the step fails
    assert 'status=1' in bad.stdout
    assert '[setup_env] failed: sh -c' in bad.stderr
    assert 'the-reason' in bad.stderr


def fake_mmcv(site, record_ext, build_ext):
    """An mmcv 2.1.0 distribution in ``site``: its RECORD lists the compiled
    ops (``mmcv/_ext...so``) when ``record_ext``, which exist when
    ``build_ext``."""
    info = site / 'mmcv-2.1.0.dist-info'
    info.mkdir(parents=True)
    (info / 'METADATA').write_text('Name: mmcv\nVersion: 2.1.0\n')
    ext = 'mmcv/_ext.cpython-311-x86_64-linux-gnu.so'
    (info / 'RECORD').write_text('mmcv/__init__.py,,\n' +
                                 (f'{ext},,\n' if record_ext else ''))
    (site / 'mmcv').mkdir()
    (site / 'mmcv' / '__init__.py').write_text('')
    if build_ext:
        (site / ext).write_text('')


@pytest.mark.parametrize('record_ext,build_ext,ready',
                         [(True, True, True), (False, False, False),
                          (True, False, False)])
def test_readiness_checks_find_mmcv_ops_without_importing(
        tmp_path, record_ext, build_ext, ready):
    site = tmp_path / 'site'
    fake_mmcv(site, record_ext, build_ext)
    out = call(
        'have mmcv 2.1.0 && echo version; have mmcv 2.2.0 || echo other; '
        'mmcv_has_ops && echo ops || echo no-ops; '
        'importable mmcv && echo found; importable no_such_mod || echo none',
        PY=sys.executable,
        PYTHONPATH=str(site))
    assert out.split() == [
        'version', 'other', 'ops' if ready else 'no-ops', 'found', 'none'
    ]


def test_uv_is_found_forced_or_refused(tmp_path):
    pinned = executable(tmp_path / 'uv-dir' / 'bin' / 'uv', '#!/bin/sh\n')
    own = executable(tmp_path / 'own' / 'uv', '#!/bin/sh\n')
    uv_dir = str(tmp_path / 'uv-dir')
    assert call(f'find_uv {uv_dir}') == pinned
    assert call(f'find_uv {tmp_path / "none"}') == ''
    assert call(f'find_uv {uv_dir}', MMCALIDET_UV=own) == own
    # a named uv that is not there is not replaced by the pinned one
    assert call(f'find_uv {uv_dir}',
                MMCALIDET_UV=str(tmp_path / 'missing')) == ''
    assert call(f'find_uv {uv_dir}', MMCALIDET_NO_UV='1') == ''


def test_uv_bootstrap_failure_leaves_nothing(tmp_path):
    no_pip = executable(tmp_path / 'bin' / 'python', '#!/bin/sh\nexit 1\n')
    target = tmp_path / 'cache' / 'uv-0.0.0'
    out = call(f'bootstrap_uv {target} 0.0.0 {no_pip}; echo status=$?')
    assert out == 'status=1'
    assert os.listdir(tmp_path / 'cache') == []


def test_uv_gets_pip_configured_sources(tmp_path):
    """uv is given the indexes, find-links, constraints, certificates and
    timeout pip is configured with, a PIP_* variable before the files."""
    conf = tmp_path / 'pip.conf'
    conf.write_text('[global]\n'
                    'index-url = https://index.example/simple\n'
                    'extra-index-url = file:///a/simple file:///b/simple\n'
                    'find-links = /file/wheels\n'
                    'constraint = /c/constraints.txt\n'
                    'no-index = false\n'
                    'cert = /c/ca.pem\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith('PIP_')}
    env.update(PIP_CONFIG_FILE=str(conf), PIP_FIND_LINKS='/env/wheels',
               PIP_DEFAULT_TIMEOUT='42')
    out = subprocess.run(
        [BASH, '-c', f'source "{SCRIPT}" && uv_pip_args {sys.executable}'],
        env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    opts = [line for line in lines if not line.startswith('env ')]
    pairs = list(zip(opts[::2], opts[1::2]))
    assert ('--index-url', 'https://index.example/simple') in pairs
    assert ('--extra-index-url', 'file:///a/simple') in pairs
    assert ('--extra-index-url', 'file:///b/simple') in pairs
    assert ('--find-links', '/env/wheels') in pairs
    assert ('--find-links', '/file/wheels') not in pairs
    assert ('--constraints', '/c/constraints.txt') in pairs
    assert '--no-index' not in lines
    assert 'env SSL_CERT_FILE=/c/ca.pem' in lines
    assert 'env UV_HTTP_TIMEOUT=42' in lines


def test_extension_cache_key_follows_the_sources(tmp_path):
    priors = tmp_path / 'mmcalidet' / 'priors'
    priors.mkdir(parents=True)
    (tmp_path / 'setup.py').write_text('flags = ["-O3"]\n')
    (priors / '_core.pyx').write_text('def f(): return 1\n')
    key = call(f'ext_cache_key {sys.executable} {tmp_path}')
    assert len(key) == 20
    assert call(f'ext_cache_key {sys.executable} {tmp_path}') == key
    (priors / '_core.pyx').write_text('def f(): return 2\n')
    changed = call(f'ext_cache_key {sys.executable} {tmp_path}')
    (tmp_path / 'setup.py').write_text('flags = ["-O2"]\n')
    other_flags = call(f'ext_cache_key {sys.executable} {tmp_path}')
    # the optimisation level setup.py reads from the environment
    level = call(f'ext_cache_key {sys.executable} {tmp_path}',
                 MMCALIDET_EXT_OPT='-O0')
    assert len({key, changed, other_flags, level}) == 4


def test_extension_cache_key_covers_every_cython_folder(tmp_path):
    layers = tmp_path / 'mmcalidet' / 'models' / 'layers'
    layers.mkdir(parents=True)
    (tmp_path / 'setup.py').write_text('flags = ["-O3"]\n')
    (layers / '_kernel.pyx').write_text('def f(): return 1\n')
    key = call(f'ext_cache_key {sys.executable} {tmp_path}')
    (layers / '_kernel.pyx').write_text('def f(): return 2\n')
    assert call(f'ext_cache_key {sys.executable} {tmp_path}') != key


def test_extensions_are_cached_and_restored_under_their_folders(tmp_path):
    """install_ext builds every module (a fake setup.py writes them), stores
    them in the cache by their paths, and a clone without them gets each
    one back in its folder; a cache entry that lacks one is built again and
    replaced."""
    root = tmp_path / 'clone'
    modules = ('mmcalidet/priors/_core', 'mmcalidet/models/layers/_kernel')
    for module in modules:
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / f'{module}.pyx').write_text(f'# {module}\n')
    suffix = '.cpython-311-x86_64-linux-gnu.so'
    (root / 'setup.py').write_text(
        f'for m in {modules!r}:\n'
        f'    open(m + "{suffix}", "w").write("built")\n'
        'open("built.txt", "a").write("x")\n')
    cache = tmp_path / 'cache'
    env = f'ROOT={root} CACHE={cache} PY={sys.executable} ' \
        f'SETUP_LOG={tmp_path / "setup.log"}'
    assert call(f'{env}; ext_modules {root}').split() == sorted(modules)
    call(f'{env}; install_ext')
    assert (root / 'built.txt').read_text() == 'x'
    entry, = (cache / 'mmcalidet-ext').iterdir()
    for module in modules:
        (root / f'{module}{suffix}').unlink()
        assert (entry / f'{module}{suffix}').exists()
    call(f'{env}; install_ext')
    assert (root / 'built.txt').read_text() == 'x'  # not built again
    for module in modules:
        assert (root / f'{module}{suffix}').read_text() == 'built'
    (entry / f'{modules[1]}{suffix}').unlink()
    call(f'{env}; install_ext')
    assert (root / 'built.txt').read_text() == 'xx'
    assert (entry / f'{modules[1]}{suffix}').exists()


def test_cuda_tag_reads_torch_version_without_importing_torch(tmp_path):
    site = tmp_path / 'site' / 'torch'
    site.mkdir(parents=True)
    (site / '__init__.py').write_text('raise ImportError("imported")\n')
    (site / 'version.py').write_text(
        'from typing import Optional\ncuda: Optional[str] = "12.8"\n')
    nvcc = executable(tmp_path / 'cuda' / 'bin' / 'nvcc', '#!/bin/sh\n')
    assert call(f'mmcv_cuda_tag {sys.executable}',
                PATH=osp.dirname(nvcc),
                PYTHONPATH=str(tmp_path / 'site')) == 'cu128'


def test_bytecode_is_compiled_once_per_set_of_distributions(tmp_path):
    site = tmp_path / 'site'
    (site / 'pkg' / 'tests').mkdir(parents=True)
    (site / 'pkg' / '__init__.py').write_text('X = 1\n')
    (site / 'pkg' / 'tests' / 'test_x.py').write_text('Y = 2\n')
    (site / 'pkg-1.0.dist-info').mkdir()
    stamp = tmp_path / 'stamp'
    pyc = site / 'pkg' / '__pycache__'
    run = f'compile_bytecode "{sys.executable}" "{site}" "{stamp}"'

    call(run)
    assert [p.name.split('.')[0] for p in pyc.iterdir()] == ['__init__']
    assert not (site / 'pkg' / 'tests' / '__pycache__').exists()
    assert stamp.read_text() == './pkg-1.0.dist-info '
    # the same distributions: nothing compiled again
    shutil.rmtree(pyc)
    call(run)
    assert not pyc.exists()
    # one more (an install or an upgrade): compiled again
    (site / 'other-2.0.dist-info').mkdir()
    call(run)
    assert pyc.is_dir()
    assert 'other-2.0' in stamp.read_text()


def test_this_environment_has_its_bytecode():
    """The venv the README's commands made imports its heavy packages from
    bytecode (tools and test workers start about 10 s sooner)."""
    import importlib.util

    import mmdet
    import mmengine
    import torch
    if osp.realpath(sys.prefix) != osp.join(PROJECT_ROOT, '.venv'):
        pytest.skip('not the venv that tools/setup_env.sh made')
    for module in (torch, mmdet, mmengine):
        assert osp.isfile(importlib.util.cache_from_source(module.__file__))


def test_a_fresh_venv_unpacks_the_bytecode_of_the_same_distributions(
        tmp_path):
    """The second venv with the same distributions (uv links the same
    files) takes the first one's bytecode from the cache, and Python runs
    it."""
    first, second, cache = (tmp_path / 'first', tmp_path / 'second',
                            tmp_path / 'cache')
    (first / 'pkg').mkdir(parents=True)
    (first / 'pkg' / '__init__.py').write_text('X = 1\n')
    (first / 'pkg-1.0.dist-info').mkdir()
    shutil.copytree(first, second)  # the sources keep their times

    def run(site):
        return subprocess.run([
            BASH, '-c', f'source "{SCRIPT}" && compile_bytecode '
            f'"{sys.executable}" "{site}" "{site}/stamp" "{cache}"'
        ],
                              capture_output=True,
                              text=True,
                              check=True).stderr

    assert 'compiling' in run(first)
    assert len(list((cache / 'bytecode').glob('*.tar'))) == 1
    assert 'reused the packages\' bytecode' in run(second)
    pyc = second / 'pkg' / '__pycache__'
    assert [p.name.split('.')[0] for p in pyc.iterdir()] == ['__init__']
    # Python runs it: a source of the same size and time is not read again
    source = second / 'pkg' / '__init__.py'
    times = (source.stat().st_atime, source.stat().st_mtime)
    source.write_text('X = 2\n')
    os.utime(source, times)
    x = subprocess.run(
        [sys.executable, '-B', '-c', 'import pkg; print(pkg.X)'],
        cwd=second,
        capture_output=True,
        text=True,
        check=True).stdout.strip()
    assert x == '1'
