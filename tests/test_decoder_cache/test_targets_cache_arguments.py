# Copyright (c) mmcalidet contributors. All rights reserved.
"""The dense and RoI caches' numbers are refused by name: NaN, inf, a
fraction or a count under 1 (before anything runs or is written)."""
import pytest

from mmcalidet.decoder_cache.train_cache import train_fingerprint
from mmcalidet.decoder_cache.dense import fill_dense_cache
from mmcalidet.decoder_cache.roi import fill_roi_cache

BAD = [0, -3, 2.5, float('nan'), float('inf')]


@pytest.mark.parametrize('value', BAD)
def test_num_locations_is_refused_by_name(value):
    with pytest.raises(ValueError, match='^num_locations must be an integer'):
        train_fingerprint('any.py', 'any.pth', num_locations=value)
    with pytest.raises(ValueError, match='^num_locations must be an integer'):
        fill_dense_cache(None, [], None, num_locations=value)
    with pytest.raises(ValueError, match='^num_rois must be an integer'):
        fill_roi_cache(None, [], None, num_rois=value)


@pytest.mark.parametrize('seed', [-1, 0.5, float('nan')])
def test_the_negatives_seed_is_refused_by_name(seed):
    with pytest.raises(ValueError, match='^seed must be an integer'):
        fill_dense_cache(None, [], None, num_locations=8, seed=seed)
