# Copyright (c) mmcalidet contributors. All rights reserved.
"""The grouped bar charts of the evaluation tools."""
import math

import matplotlib

matplotlib.use('Agg')

import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mmcalidet.visualization.calibration_curves import (  # noqa: E402
    _grouped_bars, plot_prior_sweep, plot_site_results)


def test_grouped_bars_heights_and_positions():
    fig, ax = plt.subplots()
    value = {('E0', 'A'): 0.5, ('E0', 'B'): 0.25, ('E_x', 'A'): 0.75}
    drawn = _grouped_bars(ax, ['E0', 'E_x'], ['A', 'B'], value)
    bars = ax.patches
    assert len(bars) == 4  # one per (group, series), missing ones as nan
    assert [b.get_height() for b in bars[:2]] == pytest.approx([50, 75])
    assert bars[2].get_height() == pytest.approx(25)
    assert math.isnan(bars[3].get_height())
    assert drawn[:3] == pytest.approx([50, 75, 25])
    # series A left of series B within each group, groups 1 apart
    centres = [b.get_x() + b.get_width() / 2 for b in bars]
    assert centres[0] < centres[2] < centres[1] < centres[3]
    assert centres[1] - centres[0] == pytest.approx(1.0)
    assert [t for t in ax.get_xticks()] == [0, 1]
    plt.close(fig)


def test_prior_sweep_and_site_charts_are_written(tmp_path):
    rows = [
        dict(method='CaliDINO', prior=p, AP=v)
        for p, v in [('E0', .60), ('E_t', .62), ('E_x', .70)]
    ] + [dict(method='DINO', prior='-', AP=.61)]
    path = plot_prior_sweep(rows, str(tmp_path / 'sweep.png'))
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100

    site_rows = [
        dict(site=s, epsilon=e, method='CaliDINO', prior=p, AP=v)
        for s, e in [('a', 0.03), ('b', 0.2)]
        for p, v in [('E_t', .6), ('E_site', .65)]
    ]
    path = plot_site_results(site_rows, str(tmp_path / 'sites.png'))
    assert mpimg.imread(path).shape[0] > 100


def test_the_shrinkage_sweep_plot_draws_a_line_per_site_and_method(
        monkeypatch, tmp_path):
    import mmcalidet.visualization.calibration_curves as curves
    rows = [
        dict(site=s, method=m, alpha=a, gain=g * a)
        for m in ('CaliDINO', 'DINO + re-weighting')
        for s, g in (('left_only', 1.0), ('crossed', -0.5))
        for a in (-1.0, 0.0, 1.0, 1.5)
    ]
    drawn = []
    # read the figure back before it is saved and closed
    monkeypatch.setattr(curves, '_save',
                        lambda fig, path: drawn.append(fig) or path)
    curves.plot_shrinkage_sweep(rows, str(tmp_path / 'sweep.png'))
    axes = drawn[0].axes
    assert [ax.get_title() for ax in axes] == [
        'CaliDINO', 'DINO + re-weighting'
    ]
    for ax in axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines.get('left_only').get_xdata()) == [-1, 0, 1, 1.5]
        assert list(lines.get('crossed').get_ydata()) == pytest.approx(
            [0.5, 0.0, -0.5, -0.75])
    plt.close(drawn[0])
    monkeypatch.undo()
    path = curves.plot_shrinkage_sweep(rows, str(tmp_path / 'sweep.png'))
    assert mpimg.imread(path).shape[1] > 300
