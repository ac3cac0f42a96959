# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/compare_priors.py and the comparison summary."""
import json
import os.path as osp

import numpy as np
import pytest

from mmcalidet.priors import batch_prior, save_prior
from mmcalidet.priors.compare import compare_priors

TOOL = 'tools/analysis_tools/compare_priors.py'


def test_summary_values():
    a = batch_prior(3, [[0, 1], [1, 2]])
    b = batch_prior(3, [[0, 1], [0, 2]])
    s = compare_priors(a, b, ['x', 'y', 'z'], top=2)
    diff = np.abs(b - a)
    assert s['mae'] == pytest.approx(diff.mean())
    assert s['percentiles']['100'] == pytest.approx(diff.max())
    assert s['percentiles']['50'] == pytest.approx(np.median(diff))
    top = s['top_pairs'][0]
    assert abs(top['delta']) == pytest.approx(diff.max())
    assert top['delta'] == pytest.approx(b[top['i'], top['j']] -
                                         a[top['i'], top['j']])
    assert top['class_i'] == 'xyz'[top['i']]
    with pytest.raises(ValueError, match='shape'):
        compare_priors(a, np.eye(2))


@pytest.mark.slow
def test_tool_reorders_by_name_and_writes_pngs(tmp_path, run_tool):
    names = ['person', 'bicycle', 'car']
    a = batch_prior(3, [[0, 1], [0], [2]])
    b = batch_prior(3, [[0, 1], [0, 2], [1]])
    save_prior(str(tmp_path / 'a.json'), a, names)
    order = [2, 0, 1]  # b stored in another class order
    save_prior(
        str(tmp_path / 'b.json'), b[np.ix_(order, order)],
        [names[k] for k in order])
    out = tmp_path / 'cmp'
    res = run_tool(TOOL, str(tmp_path / 'a.json'), str(tmp_path / 'b.json'),
                   '--out-dir', str(out))
    assert res.returncode == 0, res.stderr
    with open(out / 'comparison.json') as f:
        summary = json.load(f)
    assert summary['mae'] == pytest.approx(np.abs(b - a).mean())
    assert 'P(' in (out / 'comparison.md').read_text()
    for png in ('prior_a.png', 'prior_b.png', 'diff_b_minus_a.png',
                'heatmaps.png'):
        data = (out / png).read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n', png
        assert len(data) > 2000


@pytest.mark.slow
def test_tool_rejects_mismatched_classes(tmp_path, run_tool):
    save_prior(str(tmp_path / 'a.json'), np.eye(2), ['a', 'b'])
    save_prior(str(tmp_path / 'b.json'), np.eye(2), ['a', 'c'])
    res = run_tool(TOOL, str(tmp_path / 'a.json'), str(tmp_path / 'b.json'),
                   '--out-dir', str(tmp_path / 'o'))
    assert res.returncode == 1
    assert "'b' is not in the prior file" in res.stderr
    assert not osp.exists(tmp_path / 'o')
