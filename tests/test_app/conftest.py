# Copyright (c) mmcalidet contributors. All rights reserved.
import pytest


@pytest.fixture(scope='session')
def app_model_files(tmp_path_factory):
    """The seeded tiny CaliDINO's config and checkpoint
    (:func:`testing.app_model.seeded_app_model`)."""
    from testing.app_model import seeded_app_model
    return seeded_app_model(str(tmp_path_factory.mktemp('app_model')))


@pytest.fixture(scope='session')
def app_actions(app_model_files, tmp_path_factory):
    """The page's logic on it, as the tool opens it."""
    from mmcalidet.app.model_files import open_actions
    config, ckpt = app_model_files
    return open_actions(
        config,
        ckpt,
        'cpu',
        max_pixels=4_000_000,
        out_dir=str(tmp_path_factory.mktemp('app_out')))


@pytest.fixture(scope='session')
def edited_prior_file(app_actions):
    """A strongly edited prior: no class appears with any other."""
    return app_actions.apply_edits('E_t', None, None, '*|*=0', [])['file']
