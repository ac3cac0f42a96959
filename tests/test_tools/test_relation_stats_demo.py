# Copyright (c) mmcalidet contributors. All rights reserved.
"""The main demo (``make demo``): COCO statistics against the paper."""
import json
import os.path as osp

import pytest

TOOL = 'tools/misc/relation_stats_demo.py'


def test_demo_reproduces_the_paper_statistics(tmp_path, datasets_dir,
                                              run_tool):
    out = tmp_path / 'demo'
    res = run_tool(TOOL, '--data', datasets_dir, '--out-dir', str(out))
    assert res.returncode == 0, res.stderr
    with open(out / 'report.json') as f:
        report = json.load(f)
    for key, paper in report['paper'].items():
        # the paper rounds to 3 decimals
        assert report['ours'][key] == pytest.approx(paper, abs=1.5e-3), key
    assert 'max |diff| = 0.00e+00' in res.stdout  # shipped == recomputed
    assert r'P(person \| baseball glove)' in (out / 'report.md').read_text()
    for name in ('heatmaps.png', 'coco2017_train.json', 'coco2017_val.json'):
        assert osp.getsize(out / name) > 1000, name
