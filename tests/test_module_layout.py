# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tree reads one job per file: no module of the package is over 400
lines, the mixins a new detector and head inherit stay short, no import
climbs back up (``mmcalidet.utils`` imports nothing of the layers above
it; the models import neither the evaluation nor the calibration; of the
evaluation only the protocol imports the calibration, which imports only
the evaluation's metrics and re-scoring), and the test helpers stay out of
the package. Function lengths:
tests/test_evaluation/test_protocol_sites.py."""
import ast
import glob
import os.path as osp
import re

from testing import PROJECT_ROOT

#: what adding CaliDet to a new mmdet detector means reading
MIXINS = ('mmcalidet/models/detectors/calibratable.py',
          'mmcalidet/models/detectors/calibratable_detr.py',
          'mmcalidet/models/detectors/calibrated_head_calls.py',
          'mmcalidet/models/detectors/calibratable_single_stage.py',
          'mmcalidet/models/detectors/calibratable_two_stage.py',
          'mmcalidet/models/dense_heads/califormer_head.py',
          'mmcalidet/models/dense_heads/calibrated_cls.py',
          'mmcalidet/models/dense_heads/calibrated_dense_cls.py',
          'mmcalidet/models/roi_heads/calibrated_bbox_cls.py')
#: the most lines of a module of mmcalidet/
MAX_MODULE_LINES = 400
#: the modules allowed more, and why
LONG_MODULES = {
    # the Cython kernels: one compiled unit each
    'mmcalidet/priors/_cooccurrence.pyx': 'one Cython extension',
}
#: the evaluation modules the calibration may import: metrics, re-scoring
EVALUATION_FOR_CALIBRATION = ('bootstrap', 'coco', 'scoring', 'head_scoring')
#: the calibratable detector holds the prior value, its checkpoint hooks,
#: class matching and V' in one mixin (three mixins of 604 lines before)
MAX_MIXIN_LINES = 310


def test_the_mixins_a_new_detector_inherits_are_short():
    for path in MIXINS:
        with open(osp.join(PROJECT_ROOT, path)) as f:
            assert len(f.readlines()) <= MAX_MIXIN_LINES, path


def test_utils_imports_no_layer_above_it():
    for path in glob.glob(osp.join(PROJECT_ROOT, 'mmcalidet/utils/*.py')):
        with open(path) as f:
            text = f.read()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                module = ('.' * node.level) + (node.module or '')
                assert not module.startswith('..') and not (
                    module.startswith('mmcalidet.')
                    and not module.startswith('mmcalidet.utils')), (path,
                                                                    module)


def test_the_library_holds_no_argparse_options():
    """The tools' options live beside the tools
    (tools/analysis_tools/eval_options.py), not in the library."""
    for src in glob.glob(
            osp.join(PROJECT_ROOT, 'mmcalidet', '**', '*.py'), recursive=True):
        if f'{osp.sep}.mim{osp.sep}' not in src:
            assert 'add_argument(' not in open(src).read(), src


def package_imports(path: str) -> set:
    """The ``mmcalidet`` modules a module of the package imports (relative
    or absolute, at the top or inside functions), as dotted names."""
    package = osp.relpath(osp.dirname(path), PROJECT_ROOT).split(osp.sep)
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = '.'.join(package[:len(package) - node.level + 1])
                base = f'{parent}.{base}' if base else parent
            names.add(base)
            names.update(f'{base}.{a.name}' for a in node.names)
    return {n for n in names if n.split('.')[0] == 'mmcalidet'}


def modules(folder: str) -> list:
    return sorted(
        glob.glob(
            osp.join(PROJECT_ROOT, 'mmcalidet', folder, '**', '*.py'),
            recursive=True))


def test_no_module_is_over_400_lines():
    paths = [
        p for ext in ('py', 'pyx', 'pxi') for p in glob.glob(
            osp.join(PROJECT_ROOT, 'mmcalidet', '**', f'*.{ext}'),
            recursive=True)
    ]
    long = {}
    for path in paths:
        rel = osp.relpath(path, PROJECT_ROOT)
        if f'{osp.sep}.mim{osp.sep}' in path or rel in LONG_MODULES:
            continue
        with open(path) as f:
            lines = len(f.readlines())
        if lines > MAX_MODULE_LINES:
            long[rel] = lines
    assert len(paths) > 100
    assert not long, long


def test_no_import_climbs_back_up():
    for path in modules('models'):
        found = [
            n for n in package_imports(path)
            if n.startswith(('mmcalidet.evaluation', 'mmcalidet.calibration'))
        ]
        assert not found, (path, found)
    for path in modules('evaluation'):
        found = [
            n for n in package_imports(path)
            if n.startswith('mmcalidet.calibration')
        ]
        assert not found or path.endswith('protocol.py'), (path, found)
    allowed = tuple(f'mmcalidet.evaluation.{m}'
                    for m in EVALUATION_FOR_CALIBRATION)
    for path in modules('calibration'):
        for name in package_imports(path):
            if name.startswith('mmcalidet.evaluation'):
                assert name.startswith(allowed), (path, name)


def test_the_test_helpers_are_not_in_the_package():
    assert not osp.exists(osp.join(PROJECT_ROOT, 'mmcalidet', 'testing'))
    for path in glob.glob(
            osp.join(PROJECT_ROOT, 'mmcalidet', '**', '*.py'), recursive=True):
        text = open(path).read()
        assert 'import testing' not in text, path
        assert 'from testing' not in text, path


#: mmdet's head internals, named only by the head-kind adapters and heads
HEAD_INTERNALS = re.compile(r'\b(fc_cls|rtm_cls|cls_branches|conv_cls)\b')
#: where they may be named
HEAD_FOLDERS = ('mmcalidet/models/head_kinds/',
                'mmcalidet/models/dense_heads/', 'mmcalidet/models/roi_heads/')


def _python_files(*folders):
    for folder in folders:
        yield from glob.glob(
            osp.join(PROJECT_ROOT, folder, '**', '*.py'), recursive=True)


def test_head_internals_are_named_by_the_adapters_and_heads_only():
    """No code (comments and docstrings included) outside the head-kind
    adapters and the heads names mmdet's classification layers: a new
    head family lands in one adapter and one head class."""
    found = []
    for path in _python_files('mmcalidet', 'tools', 'projects', 'benchmarks'):
        rel = osp.relpath(path, PROJECT_ROOT)
        if rel.startswith(HEAD_FOLDERS) or '/tests/' in rel:
            continue
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if HEAD_INTERNALS.search(line):
                    found.append(f'{rel}:{number}: {line.strip()}')
    assert not found, '\n'.join(found)


def test_models_import_neither_evaluation_nor_deploy():
    """The adapters name the evaluation's, the cache's and the export's
    parts by import path; mmcalidet.models imports nothing of the layers
    above it (the kinds of cache and their errors, which the cached
    calibrator reads, are ``mmcalidet.utils.cache_kinds``'s)."""
    above = ('evaluation', 'deploy', 'engine', 'decoder_cache', 'apis')
    for path in _python_files('mmcalidet/models'):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [(node.level, node.module or '')]
            elif isinstance(node, ast.Import):
                names = [(0, alias.name) for alias in node.names]
            for level, module in names:
                parts = module.split('.')
                # mmcalidet.<pkg> absolutely, or ...<pkg> from a module two
                # or three folders down
                package = '.'.join(parts[1:]) if parts[0] == 'mmcalidet' \
                    else module if level >= 2 else ''
                assert not package.startswith(above), (path, module)


def test_the_cache_imports_the_models_lazily():
    """mmcalidet.decoder_cache runs the models (their head-kind adapters)
    inside its functions only: no import at a module's top level reaches
    mmcalidet.models, so importing the cache imports no model and the
    two packages make no loop."""
    for path in modules('decoder_cache'):
        package = osp.relpath(osp.dirname(path), PROJECT_ROOT).split(osp.sep)
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parent = '.'.join(package[:len(package) - node.level + 1])
                    base = f'{parent}.{base}' if base else parent
                assert not base.startswith('mmcalidet.models'), (path, base)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith('mmcalidet.models'), (
                        path, alias.name)
