# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tree reads one job per file: the mixins a new detector and head
inherit stay short, and ``mmcalidet.utils`` imports nothing of the layers
above it (a deprecated forwarding module aside). Function lengths:
tests/test_evaluation/test_protocol_sites.py."""
import ast
import glob
import os.path as osp
import re

from mmcalidet.testing import PROJECT_ROOT

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
        if 'warn_deprecated(__name__' in text:
            continue  # a forwarding module kept for one release
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                module = ('.' * node.level) + (node.module or '')
                assert not module.startswith('..') and not (
                    module.startswith('mmcalidet.')
                    and not module.startswith('mmcalidet.utils')), (path,
                                                                    module)


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
    """The adapters name the evaluation's and the export's parts by import
    path; mmcalidet.models imports nothing of the layers above it."""
    above = ('evaluation', 'deploy', 'engine', 'decoder_cache.build', 'apis')
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
