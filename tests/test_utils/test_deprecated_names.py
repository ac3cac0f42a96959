# Copyright (c) mmcalidet contributors. All rights reserved.
"""Old names kept for one release (mmcalidet.utils.deprecation): each still
gives the new object and warns once with a DeprecationWarning naming the
new place; the priors' loaders live in mmcalidet.priors, and no module of
mmcalidet.utils imports it."""
import ast
import glob
import importlib
import os
import os.path as osp
import subprocess
import sys
import warnings

import pytest

from mmcalidet.utils import deprecation
from testing import PROJECT_ROOT

#: (module, old name, new module, new name) of the names served by a
#: module-level __getattr__
OLD_NAMES = [
    ('mmcalidet.datasets', 'build_decoder_cache', 'mmcalidet.decoder_cache',
     'build_decoder_cache'),
]


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which old names this process was warned of (once each)."""
    monkeypatch.setattr(deprecation, '_warned', set())


def deprecation_messages(record) -> list:
    return [
        str(w.message) for w in record
        if issubclass(w.category, DeprecationWarning)
        and 'mmcalidet' in str(w.message)
    ]


@pytest.mark.parametrize(
    'module,old,new_module,new',
    OLD_NAMES,
    ids=[f'{m}.{o}' for m, o, _, _ in OLD_NAMES])
def test_old_name_gives_the_new_object_and_warns_once(fresh_warnings, module,
                                                      old, new_module, new):
    target = getattr(importlib.import_module(new_module), new)
    with pytest.warns(DeprecationWarning) as record:
        namespace = {}
        exec(f'from {module} import {old}', namespace)
    assert namespace[old] is target
    (message, ) = deprecation_messages(record)
    assert message.startswith(f'{module}.{old} is deprecated')
    assert f'use {new_module}.{new}' in message
    # the warning points at the line that used the old name
    assert record[0].filename == '<string>'
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter('always')
        assert getattr(importlib.import_module(module), old) is target
    assert deprecation_messages(again) == []


@pytest.mark.parametrize('module', sorted({m for m, _, _, _ in OLD_NAMES}))
def test_old_names_stay_out_of_all_and_unknown_names_still_fail(module):
    mod = importlib.import_module(module)
    old = {o for m, o, _, _ in OLD_NAMES if m == module}
    assert not old & set(getattr(mod, '__all__', ())), 'star imports warn'
    with pytest.raises(AttributeError, match='no attribute'):
        mod.no_such_name
    assert not hasattr(mod, '__no_such_dunder__')


def priors_imports(source: str) -> list:
    """The imports of mmcalidet.priors (or a module of it) in the source of
    a module of mmcalidet/utils, at the top or inside functions, relative
    or absolute."""
    package = ['mmcalidet', 'utils']
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = '.'.join(package[:len(package) - node.level + 1])
                base = f'{parent}.{base}' if base else parent
            names.add(base)
            names.update(f'{base}.{alias.name}' for alias in node.names)
    return sorted(
        name for name in names
        if name == 'mmcalidet.priors' or name.startswith('mmcalidet.priors.'))


def test_the_import_check_sees_every_form():
    for line in ('from ..priors import load_prior',
                 'from .. import priors',
                 'from ..priors.prior_io import load_prior',
                 'import mmcalidet.priors.statistics',
                 'from mmcalidet.priors import flat_prior',
                 'def f():\n    from ..priors import load_prior'):
        assert priors_imports(line), line
    for line in ('from .file_io import load_json',
                 'from ..version import __version__',
                 'import mmcalidet.utils.file_io'):
        assert not priors_imports(line), line


def test_utils_modules_do_not_import_the_priors():
    files = sorted(
        glob.glob(osp.join(PROJECT_ROOT, 'mmcalidet', 'utils', '*.py')))
    assert len(files) > 5
    for path in files:
        found = priors_imports(open(path).read())
        assert not found, f'{osp.relpath(path, PROJECT_ROOT)} imports {found}'


@pytest.mark.slow
@pytest.mark.parametrize('module', [
    'mmcalidet.priors', 'mmcalidet.utils', 'mmcalidet.priors.prior_source',
    'mmcalidet.utils.deprecation'
])
def test_light_modules_import_alone_without_torch(module):
    """In a fresh process, first: no import circle, and still light."""
    code = (f'import sys, warnings; warnings.simplefilter("error"); '
            f'import {module}; '
            'print(sorted(m for m in ("torch", "mmengine", "mmdet") '
            'if m in sys.modules))')
    env = dict(os.environ, MMCALIDET_LIGHT='1', PYTHONPATH=PROJECT_ROOT)
    out = subprocess.run([sys.executable, '-c', code],
                         capture_output=True,
                         text=True,
                         env=env,
                         cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['[]']
