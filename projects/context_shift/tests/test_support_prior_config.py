# Copyright (c) mmcalidet contributors. All rights reserved.
"""The support-aware prior candidate trains with tools/train.py on a random
DINO's cached decoder outputs of generated scenes."""
import pytest


@pytest.mark.slow
def test_the_support_recipe_trains_with_tools_train(train_recipe):
    log = train_recipe(
        'calidet_dino_tiny_context-shift_cached_support.py', 'dataset',
        # every step a simulated site with its support
        'model.data_preprocessor.batch_augments.0.mode_probs.sample=0',
        'model.data_preprocessor.batch_augments.0.mode_probs.batch=0',
        'model.data_preprocessor.batch_augments.0.mode_probs.dataset=0')
    assert 'Iter(train) [3/3]' in log and 'loss_loma' in log
