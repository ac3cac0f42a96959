# Copyright (c) mmcalidet contributors. All rights reserved.
"""Deprecated: the evaluation tools' options moved out of the library, to
``tools/analysis_tools/eval_options.py`` (kept for one release; warns once
on import).

The module is loaded from the tools of the source tree or of the
installed package's ``.mim`` folder.
"""
import importlib.util
import os.path as osp
import sys

from ..utils.deprecation import warn_deprecated

_NAME = 'mmcalidet_tools_eval_options'
_RELATIVE = osp.join('tools', 'analysis_tools', 'eval_options.py')


def _load_tools_module():
    """The tools' ``eval_options`` module (imported once)."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    candidates = [
        osp.join(osp.dirname(package), _RELATIVE),
        osp.join(package, '.mim', _RELATIVE)
    ]
    path = next((p for p in candidates if osp.isfile(p)), None)
    if path is None:
        raise ImportError('mmcalidet.evaluation.tool_options moved to '
                          f'{_RELATIVE}, which is not found here')
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


_module = _load_tools_module()
add_model_args = _module.add_model_args
eval_setup = _module.eval_setup
ensure_out_dir = _module.ensure_out_dir

__all__ = ['add_model_args', 'eval_setup', 'ensure_out_dir']

warn_deprecated(
    __name__, 'tools/analysis_tools/eval_options.py', skip=(__name__, ))
