# Copyright (c) mmcalidet contributors. All rights reserved.
"""prior_signal.py: one image's prior is never fractional, a large batch's
mostly is, and the noise on E_t carries no label information."""
import os.path as osp

import numpy as np
import pytest

from projects.context_shift.context_shift.data import make_context_shift
from projects.context_shift.tools.prior_signal import (fractional, main,
                                                       prior_signal)


def test_fractional_entries():
    values = np.array([0.0, 0.5, 1.0, 0.25, 1 / 3, 0.999])
    assert fractional(values).tolist() == [
        False, False, False, True, True, True
    ]


def test_the_modes_on_a_tiny_folder(tmp_path):
    root = str(tmp_path / 'cs')
    make_context_shift(
        root,
        seed=0,
        num_train=40,
        num_val_per_site=4,
        img_size=64,
        digit_size=(8, 14),
        progress=False)
    png = str(tmp_path / 'signal.png')
    rows = {r['mode']: r for r in main([root, '--draws', '16', '--plot', png])}
    # E_x holds exactly 0, 0.5 and 1 off the diagonal: nothing fractional
    assert rows['E_x']['fractional'] == 0
    assert rows['E_b(1)']['fractional'] == 0
    # the largest batch the folder allows is mostly fractional
    assert 'E_b(128)' not in rows  # more than the 40 images
    assert rows['E_b(32)']['fractional'] > 0.3
    assert rows['E_b(32)']['fractional'] > rows['E_b(4)']['fractional']
    # E_t's noise is fractional but unrelated to the labels
    assert rows['E_t + noise']['fractional'] > 0.3
    assert rows['E_t + noise']['informative'] == 0
    assert 'E_swapped (val site)' in rows
    # the noise misleads about the images it calibrates
    assert rows['E_t + noise']['predictive'] < 0
    assert 'E_sim (tilted site), its own batch' in rows
    assert osp.getsize(png) > 0


def test_the_predictive_gain_by_hand():
    from projects.context_shift.tools.prior_signal import predictive_gain
    e_t = np.full((3, 3), 0.5)
    np.fill_diagonal(e_t, 1.0)
    prior = e_t.copy()
    prior[1, 0] = 0.8  # P(1 | 0): 0.8 against E_t's 0.5
    prior[2, 0] = 0.3
    # one image with classes 0 and 1: entries (1, 0) and (2, 0) counted
    # (column 0 present; 0.5 elsewhere is not fractional)
    out = predictive_gain(prior[None], [[np.array([0, 1])]], e_t)
    want = (np.log(0.8) - np.log(0.5)) + (np.log(0.7) - np.log(0.5))
    assert out['predictive'] == pytest.approx(1000 * want / 2)
    assert out['counted'] == 2
    # the same prior on an image without class 1 predicts it wrongly
    out = predictive_gain(prior[None], [[np.array([0])]], e_t)
    want = (np.log(0.2) - np.log(0.5)) + (np.log(0.7) - np.log(0.5))
    assert out['predictive'] == pytest.approx(1000 * want / 2)
    # no present column with a fractional entry: nothing counted
    out = predictive_gain(prior[None], [[np.array([2])]], e_t)
    assert np.isnan(out['predictive']) and out['counted'] == 0
    for clip in (float('nan'), -0.1, 0.5):
        with pytest.raises(ValueError, match='clip'):
            predictive_gain(prior[None], [[np.array([0])]], e_t, clip=clip)
    with pytest.raises(ValueError, match='2 priors but images for 1'):
        predictive_gain(np.stack([prior, prior]), [[np.array([0])]], e_t)


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match='no training images|none'):
        prior_signal([], 10)
    with pytest.raises(ValueError, match='draws'):
        prior_signal([np.array([0, 1])], 10, draws=0)
    with pytest.raises(ValueError, match='noise_std'):
        prior_signal([np.array([0, 1])], 10, noise_std=float('nan'))
    with pytest.raises(ValueError, match='instances_train.json'):
        main([str(tmp_path)])
