# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/compare_results.py: two benchmark results.json
compared table by table (in-process, no subprocess)."""
import importlib.util
import json
import os
import os.path as osp

import pytest

import mmcalidet  # noqa: F401  (whole, before the tool asks for it light)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(ROOT, 'tools', 'analysis_tools', 'compare_results.py')


@pytest.fixture(scope='module')
def tool():
    light = os.environ.get('MMCALIDET_LIGHT')
    spec = importlib.util.spec_from_file_location('compare_results', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if light is None:
        os.environ.pop('MMCALIDET_LIGHT', None)
    yield module


def results(ap=0.25, claim='holds', seconds=1.0):
    return dict(
        sites=[
            dict(site='crossed', method='CaliDINO', prior='E_t', AP=0.2),
            dict(
                site='crossed',
                method='CaliDINO',
                prior='E_site',
                AP=ap,
                APs=float('nan'),
                seconds=seconds)
        ],
        claims=[f'order: **{claim}**'],
        timings=dict(sites=seconds),
        command=f'run {seconds}')


def write(path, data):
    with open(path, 'w') as f:
        json.dump(data, f)
    return str(path)


def test_identical_tables_ignore_timings(tool, tmp_path, capsys):
    a = write(tmp_path / 'a.json', results(seconds=1.0))
    b = write(tmp_path / 'b.json', results(seconds=7.0))
    with pytest.raises(SystemExit) as exc:
        tool.run_tool(tool.main, [a, b])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert 'sites: identical' in out and 'claims: identical' in out
    assert 'timings' not in out and out.strip().endswith('identical')


def test_differences_are_listed_by_row(tool, tmp_path, capsys):
    a = write(tmp_path / 'a.json', results(ap=0.25))
    b = write(tmp_path / 'b.json', results(ap=0.25 + 1e-12, claim='fails'))
    with pytest.raises(SystemExit) as exc:
        tool.run_tool(tool.main, [a, b])
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert 'sites: 1 difference(s)' in out
    assert 'sites[1: crossed, CaliDINO, E_site].AP' in out
    assert 'claims: 1 difference(s)' in out
    assert out.strip().endswith('different')
    # within a tolerance the numbers agree; the claim still differs
    assert tool.compare_results(
        results(ap=0.25), results(ap=0.25 + 1e-12), tol=1e-9)['sites'] == []


def test_rows_and_tables_present_in_one_file_only(tool):
    a, b = results(), results()
    b['sites'].append(dict(site='left_only', AP=0.1))
    b['online'] = []
    out = tool.compare_results(a, b)
    assert out['sites'] == ['sites: 2 vs 3 entries']
    assert out['online'] is None


def test_bad_input_is_one_line(tool, tmp_path, capsys):
    a = write(tmp_path / 'a.json', results())
    bad = tmp_path / 'bad.json'
    bad.write_text('{not json')
    with pytest.raises(SystemExit) as exc:
        tool.run_tool(tool.main, [a, str(bad)])
    assert exc.value.code == 1
    assert 'bad.json: not JSON' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.run_tool(tool.main, [a, a, '--tables', 'nope'])
    assert "neither file has 'nope'" in capsys.readouterr().err
