#!/usr/bin/env python
# Copyright (c) mmcalidet contributors. All rights reserved.
"""Packaging for mmcalidet.

Builds the Cython cores (the statistics' counting,
``mmcalidet.priors._cooccurrence``, and the CPU's deformable attention,
``mmcalidet.models.layers._deform_attn_cpu``) and the ``.mim`` folder
(tools, configs) that ``mim train mmcalidet <config>`` reads, as mmyolo
does. Editable installs (``pip install -e .``: setuptools runs
``editable_wheel``, or the legacy ``develop``) link the folders so edits show
at once; regular installs copy them into the wheel.
"""
import os
import os.path as osp
import platform
import shutil
import sys
import warnings
from setuptools import Extension, find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))
# what mim reads from mmcalidet/.mim: the tools, the configs and the model
# index of configs/calidet/metafile.yml (``mim search mmcalidet``)
MIM_FILES = ('tools', 'configs', 'model-index.yml')
# the Cython modules under mmcalidet/ and their extra compiler flags
# (tools/setup_env.sh caches every mmcalidet/**/*.pyx's build): the
# deformable attention kernel twice, the second for CPUs with AVX2 and FMA
# (x86-64 only; cpu_deform_attn.py takes it where torch finds them)
X86_64 = platform.machine().lower() in ('x86_64', 'amd64')
EXTENSIONS = {
    'priors._cooccurrence': [],
    'models.layers._deform_attn_cpu': [],
    **({
        'models.layers._deform_attn_cpu_avx2': ['-mavx2', '-mfma']
    } if X86_64 else {})
}


def readme() -> str:
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        return f.read()


def get_version() -> str:
    scope: dict = {}
    with open(osp.join(ROOT, 'mmcalidet', 'version.py')) as f:
        exec(compile(f.read(), 'version.py', 'exec'), scope)
    return scope['__version__']


def parse_requirements(fname: str) -> list:
    """Read the requirement lines of ``requirements/<fname>``."""
    reqs = []
    with open(osp.join(ROOT, 'requirements', fname)) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line and not line.startswith('-'):
                reqs.append(line)
    return reqs


def add_mim_extension() -> None:
    """Add tools, configs and the model index to ``mmcalidet/.mim`` (as
    mmyolo's setup.py).

    Symlinks in editable mode, copies otherwise, so ``mim train mmcalidet``
    finds ``tools/train.py`` and the configs, and ``mim search mmcalidet``
    the model index, in both kinds of install.
    """
    if any(cmd in sys.argv for cmd in ('develop', 'editable_wheel')):
        mode = 'symlink'
    elif any(cmd in sys.argv
             for cmd in ('install', 'bdist_wheel', 'sdist', 'build',
                         'build_py')):
        mode = 'copy'
    else:
        return
    mim_path = osp.join(ROOT, 'mmcalidet', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for name in MIM_FILES:
        src = osp.join(ROOT, name)
        dst = osp.join(mim_path, name)
        if not osp.exists(src):
            continue
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim_path), dst,
                       target_is_directory=osp.isdir(src))
        elif osp.isdir(src):
            shutil.copytree(src, dst,
                            ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copyfile(src, dst)


def get_extensions() -> list:
    """The Cython extensions: the statistics' counting core and the CPU's
    multi-scale deformable attention (:data:`EXTENSIONS`).

    Compiled at ``-O3`` unless ``MMCALIDET_EXT_OPT`` names another level.
    None when ``MMCALIDET_NO_EXT=1``: tools/setup_env.sh then installs the
    package (editable) without them, and puts the compiled modules in place
    from its cache, or builds them there with ``build_ext --inplace``.

    Returns:
        list: The extensions to build.
    """
    if os.environ.get('MMCALIDET_NO_EXT') == '1':
        return []
    # the compiler's optimisation level (MMCALIDET_EXT_OPT, default -O3): a
    # build that only checks what a wheel holds can take -O0
    optimization = os.environ.get('MMCALIDET_EXT_OPT', '-O3')
    if optimization not in ('-O0', '-O1', '-O2', '-O3'):
        raise ValueError(f'MMCALIDET_EXT_OPT must be one of -O0 ... -O3, '
                         f'not {optimization!r}')
    import numpy as np
    from Cython.Build import cythonize
    exts = [
        Extension(
            f'mmcalidet.{module}',
            sources=[f'mmcalidet/{module.replace(".", "/")}.pyx'],
            include_dirs=[np.get_include()],
            define_macros=[('NPY_NO_DEPRECATED_API', 'NPY_1_7_API_VERSION')],
            extra_compile_args=[optimization, '-fopenmp', *flags],
            extra_link_args=['-fopenmp'],
        ) for module, flags in EXTENSIONS.items()
    ]
    return cythonize(exts, language_level=3, quiet=True)


if __name__ == '__main__':
    add_mim_extension()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        setup(
            name='mmcalidet',
            version=get_version(),
            description='Run-time calibratable DETR-family detectors '
            '(CaliDet) for MMDetection 3.x',
            long_description=readme(),
            long_description_content_type='text/markdown',
            keywords='computer vision, object detection, calibration',
            # the package alone: the checkout's test helpers (testing/),
            # tests, tools and projects stay out of the wheel
            packages=find_packages(include=('mmcalidet', 'mmcalidet.*')),
            include_package_data=True,
            package_data={
                'mmcalidet': [
                    'data/*.json', 'data/priors/*.json', 'priors/*.pyx',
                    'models/layers/*.pyx', 'models/layers/*.pxi',
                    '.mim/configs/**/*', '.mim/tools/**/*', '.mim/configs/*',
                    '.mim/tools/*', '.mim/model-index.yml'
                ]
            },
            ext_modules=get_extensions(),
            python_requires='>=3.8',
            install_requires=parse_requirements('mminstall.txt') +
            ['numpy', 'pycocotools', 'matplotlib', 'tqdm'],
            extras_require={
                'tests': parse_requirements('tests.txt'),
                'deploy': parse_requirements('deploy.txt'),
                'app': parse_requirements('app.txt'),
                'build': ['Cython>=3.0', 'numpy'],
            },
            license='Apache License 2.0',
            zip_safe=False)
