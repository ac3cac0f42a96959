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
    assert osp.getsize(png) > 0


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match='no training images|none'):
        prior_signal([], 10)
    with pytest.raises(ValueError, match='draws'):
        prior_signal([np.array([0, 1])], 10, draws=0)
    with pytest.raises(ValueError, match='instances_train.json'):
        main([str(tmp_path)])
