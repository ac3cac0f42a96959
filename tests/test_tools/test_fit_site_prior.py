# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/fit_site_prior.py as a user runs it: a site's
labelled images in, a prior file that records how it was fitted out."""
import json
import os.path as osp
import runpy

import numpy as np
import pytest
from mmengine.runner import save_checkpoint

from mmcalidet.priors import load_prior
from testing import PROJECT_ROOT, build_detector, data_root, run_tool

pytestmark = pytest.mark.slow

TOOL = 'tools/analysis_tools/fit_site_prior.py'
CONFIG = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
SITE_ANN = osp.join(data_root(), 'coco-mini', 'reference',
                    'instances_val2017_coco-mini.json')
SITE_IMGS = osp.join(data_root(), 'coco-mini', 'images', 'val2017')


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    model = build_detector('calidet/calidet_dino_tiny_coco-mini.py', seed=0)
    path = str(tmp_path_factory.mktemp('ckpt') / 'calidino.pth')
    save_checkpoint(dict(state_dict=model.state_dict()), path)
    return path, model.get_prior()


def test_the_tool_writes_a_fitted_prior_and_its_record(checkpoint, tmp_path):
    ckpt, train_prior = checkpoint
    out = str(tmp_path / 'site.json')
    res = run_tool(TOOL, CONFIG, ckpt, '--site-ann', SITE_ANN,
                   '--site-img-dir', SITE_IMGS, '--out', out, '--max-images',
                   '12', '--resamples', '50', '--device', 'cpu',
                   '--no-progress', '--out-dir', str(tmp_path / 'report'))
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'fitting on 12 labelled site images (4 folds)' in res.stdout
    prior, meta = load_prior(out, return_meta=True)
    with open(out) as f:
        record = json.load(f)
    assert record['source'] == 'fit_site_prior'
    assert record['num_images'] == 12 and record['folds'] == 4
    assert record['accept'] == 'interval'  # the default
    low, high = record['cv_gain_interval_95']
    assert low <= high
    # the file holds E_t + alpha (E_site - E_t) of the 12 images' labels
    with open(osp.join(tmp_path, 'report', 'site_prior.json')) as f:
        report = json.load(f)
    assert report['out'] == out and len(report['candidates']) == 1
    # E_t when no candidate gained, else a prior moved off E_t that gained
    if record['alpha'] == 0:
        assert record['cv_gain_ap'] == 0
        np.testing.assert_allclose(prior, train_prior, atol=1e-6)
    else:  # the whole interval above 0
        assert record['cv_gain_ap'] > 0 and low > 0
        assert record['absent'] in ('train', 'flat')
        assert not np.allclose(prior, train_prior, atol=1e-6)
    assert meta['classes'][0] == 'person'


def test_bad_options_are_one_line(checkpoint, tmp_path, capsys):
    # argparse's errors, before any work: in this process (the run above
    # starts the tool from the command line)
    ckpt, _ = checkpoint
    tool = runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')
    out = str(tmp_path / 'x.json')
    cases = [(['--site-ann', SITE_ANN], 'together'),
             (['--alphas', '0'], '--alphas')]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exc:
            tool['main']([CONFIG, ckpt, *extra, '--out', out])
        assert exc.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert 'error: ' in last and message in last, last
    assert not osp.exists(out)
