# Copyright (c) mmcalidet contributors. All rights reserved.
"""The main demo (``make demo``): COCO statistics against the paper."""
import json
import os.path as osp

import numpy as np
import pytest

from mmcalidet.priors import default_prior_path, load_prior

pytestmark = pytest.mark.slow

TOOL = 'tools/misc/relation_stats_demo.py'
#: the paper's figures (rounded to 3 decimals there)
PAPER = {
    'P(person | baseball glove), train': 0.990,
    'MAE(E_v, E_t)': 0.008,
    'p50 |E_v - E_t|': 0.003,
    'p90 |E_v - E_t|': 0.021,
    'p97 |E_v - E_t|': 0.044,
    'p100 |E_v - E_t|': 0.272,
}


def test_demo_reproduces_the_paper_statistics(tmp_path, datasets_dir,
                                              run_tool):
    out = tmp_path / 'demo'
    res = run_tool(TOOL, '--data', datasets_dir, '--out-dir', str(out))
    assert res.returncode == 0, res.stderr
    # the priors it wrote are the shipped ones (both in one class order)
    _, meta = load_prior(
        default_prior_path('coco2017_train'), return_meta=True)
    classes = meta['classes']
    priors = {}
    for split in ('train', 'val'):
        priors[split] = load_prior(
            str(out / f'coco2017_{split}.json'), classes=classes)
        np.testing.assert_array_equal(
            priors[split],
            load_prior(
                default_prior_path(f'coco2017_{split}'), classes=classes))
    # its report: the figures of those priors, and the paper's
    e_t, e_v = priors['train'], priors['val']
    diff = np.abs(e_v - e_t)  # over all K^2 entries, as the paper
    expected = {
        f'p{p} |E_v - E_t|': np.percentile(diff, p)
        for p in (50, 90, 97, 100)
    }
    expected['MAE(E_v, E_t)'] = diff.mean()
    person, glove = classes.index('person'), classes.index('baseball glove')
    expected['P(person | baseball glove), train'] = e_t[person, glove]
    with open(out / 'report.json') as f:
        ours = json.load(f)['ours']
    assert set(ours) == set(PAPER)
    for key, paper in PAPER.items():
        assert ours[key] == pytest.approx(expected[key], abs=1e-9), key
        assert ours[key] == pytest.approx(paper, abs=1.5e-3), key
    assert osp.getsize(out / 'report.md') > 0
    assert osp.getsize(out / 'heatmaps.png') > 1000
