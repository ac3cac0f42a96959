# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/misc/check_tables.py: the evaluation tables of the seeded tiny
detectors are those recorded in tests/data/check_tables.json (before the
head-kind adapters), and a difference is named."""
import copy
import json
import os.path as osp
import runpy

import pytest

from testing import PROJECT_ROOT, run_tool

TOOL = 'tools/misc/check_tables.py'
RECORD = osp.join(PROJECT_ROOT, 'tests', 'data', 'check_tables.json')


def tool_module():
    return runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')


def test_first_difference_names_the_number():
    first_difference = tool_module()['first_difference']
    with open(RECORD) as f:
        before = json.load(f)
    now = copy.deepcopy(before)
    assert first_difference(before, now) is None
    now['detectors']['rtmdet']['injection'][2]['AP'] = 0.5
    assert first_difference(
        before,
        now) == ('detectors.rtmdet.injection[2].AP: 0.0 before, 0.5 now')
    now = copy.deepcopy(before)
    del now['detectors']['rtmdet']['sweep'][0]
    assert first_difference(before,
                            now).startswith('detectors.rtmdet.sweep[]: ')


@pytest.mark.slow
def test_tables_are_those_recorded_before_the_adapters():
    arithmetic = tool_module()['arithmetic']
    with open(RECORD) as f:
        recorded = json.load(f)['arithmetic']
    if recorded != arithmetic():
        pytest.skip(f'recorded with {recorded}, not this arithmetic')
    res = run_tool(TOOL, '--compare', RECORD, threads=1)
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'tables identical' in res.stdout
