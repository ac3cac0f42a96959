# Copyright (c) mmcalidet contributors. All rights reserved.
"""The protocol is wired in one place (issue #51): the tools, the test
loops, the context-shift benchmark and the benchmarks call
``mmcalidet.evaluation.protocol`` instead of chaining ``build_priors``,
``evaluate_priors`` and ``check_expected_order`` by hand; ``evaluate_all``
takes explicit arguments; and no function outside the tests is longer
than 80 lines (its docstring left out)."""
import ast
import glob
import inspect
import os.path as osp

import pytest

from testing import PROJECT_ROOT

#: the places that run a protocol table
PROTOCOL_SITES = [
    'tools/analysis_tools/eval_priors.py',
    'projects/context_shift/context_shift/evaluation.py',
    'projects/context_shift/experiments/calibrator_curve.py',
    'mmcalidet/engine/prior_sweep_loop.py',
    'mmcalidet/engine/subset_eval_loop.py',
    'mmcalidet/engine/self_calibration_loop.py',
    'benchmarks/bench_eval_cache.py',
]
#: the steps of the injection chain only protocol.py composes
CHAIN = ('build_priors', 'evaluate_priors', 'evaluate_subsets',
         'evaluate_groups', 'self_calibrate_partitions', 'shrinkage_sweep',
         'deployment_gains', 'stream_site')
MAX_LINES = 80


def called_names(path: str) -> set:
    """The names a module calls (``f(...)`` and ``x.f(...)``)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Call):
            fn = node.func
            names.add(
                fn.attr if isinstance(fn, ast.Attribute
                                      ) else getattr(fn, 'id', None))
    return names


@pytest.mark.parametrize('site', PROTOCOL_SITES)
def test_protocol_sites_call_the_protocol_module(site):
    path = osp.join(PROJECT_ROOT, site)
    source = open(path).read()
    assert 'protocol' in source, site
    repeated = sorted(called_names(path) & set(CHAIN))
    assert not repeated, f'{site} calls {repeated} itself'


def function_lengths(path: str):
    """``(name, lines)`` of every function of a module, its docstring left
    out."""
    for node in ast.walk(ast.parse(open(path).read())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = node.end_lineno - node.lineno + 1
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(
                first.value, ast.Constant) and isinstance(
                    first.value.value, str):
            lines -= first.end_lineno - first.lineno + 1
        yield node.name, lines


def test_no_function_is_longer_than_80_lines():
    paths = []
    for folder in ('mmcalidet', 'tools', 'projects', 'benchmarks'):
        paths += glob.glob(
            osp.join(PROJECT_ROOT, folder, '**', '*.py'), recursive=True)
    paths = [
        p for p in paths if f'{osp.sep}tests{osp.sep}' not in p
        and f'{osp.sep}.mim{osp.sep}' not in p
    ]
    assert len(paths) > 50
    long = [(osp.relpath(p, PROJECT_ROOT), name, n) for p in paths
            for name, n in function_lengths(p) if n > MAX_LINES]
    assert not long, long


def test_evaluate_all_takes_explicit_arguments():
    from projects.context_shift.context_shift import evaluate_all
    params = inspect.signature(evaluate_all).parameters
    assert 'args' not in params
    for name in ('data', 'posthoc', 'quick', 'fit_labelled', 'fit_repeats',
                 'self_cal_iters', 'score_thr', 'self_cal_radius',
                 'online_radius'):
        assert name in params, name
    source = inspect.getsource(inspect.getmodule(evaluate_all))
    assert 'argparse' not in source
