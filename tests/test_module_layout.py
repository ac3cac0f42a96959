# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tree reads one job per file: the mixins a new detector and head
inherit stay short, and ``mmcalidet.utils`` imports nothing of the layers
above it. Function lengths:
tests/test_evaluation/test_protocol_sites.py."""
import ast
import glob
import os.path as osp

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
            osp.join(PROJECT_ROOT, 'mmcalidet', '**', '*.py'),
            recursive=True):
        if f'{osp.sep}.mim{osp.sep}' not in src:
            assert 'add_argument(' not in open(src).read(), src
