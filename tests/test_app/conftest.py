# Copyright (c) mmcalidet contributors. All rights reserved.
import os

import pytest

#: ``MMCALIDET_APP_MODEL=demo``: the page's tests run on the CaliDINO that
#: ``make demo`` trained (the screenshot in README and inject_prior.md),
#: not on the seeded tiny model (the default, in CI)
APP_MODEL = os.environ.get('MMCALIDET_APP_MODEL', 'seeded')


@pytest.fixture(scope='session')
def app_model_files(tmp_path_factory):
    """The seeded tiny CaliDINO's config and checkpoint
    (:func:`testing.app_model.seeded_app_model`), or the demo's."""
    if APP_MODEL == 'demo':
        from mmcalidet.app.model_files import demo_model
        return demo_model()
    assert APP_MODEL == 'seeded', \
        f'MMCALIDET_APP_MODEL is demo or seeded, not {APP_MODEL!r}'
    from testing.app_model import seeded_app_model
    return seeded_app_model(str(tmp_path_factory.mktemp('app_model')))


@pytest.fixture(scope='session')
def page_inputs(app_actions):
    """The image and the prior the browser test picks: a coco-mini image
    under the bundled COCO val prior on the seeded model; the crossed site's
    first image under that site's statistics on the demo's."""
    if APP_MODEL == 'demo':
        examples = app_actions.session.examples
        site = 'site crossed (statistics)'
        assert site in app_actions.session.named, 'run `make demo` first'
        return next(e for e in examples if 'crossed' in e), site
    from testing.app_model import coco_mini_val_image
    return coco_mini_val_image(), 'coco2017_val'


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
