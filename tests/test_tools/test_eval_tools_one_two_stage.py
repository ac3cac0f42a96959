# Copyright (c) mmcalidet contributors. All rights reserved.
"""The evaluation tools (eval_priors.py, fit_site_prior.py,
self_calibrate.py) on a one-stage (CaliRTMDet) and a two-stage
(CaliFasterRCNN) detector, as a user runs them: each scores the detector
from its cached features under the priors it asks for and writes its
report. A plain one-stage baseline gets its post-hoc corrections; a plain
two-stage one the marginal re-weighting of its softmax, and the
co-occurrence rescoring asked for by name is refused in one line. Random
weights: contracts, not accuracy."""
import json
import os.path as osp

import pytest
from mmengine.runner import save_checkpoint

from mmcalidet.priors import load_prior
from testing import build_detector, data_root, run_tool

pytestmark = pytest.mark.slow

TOOLS = 'tools/analysis_tools/'
MINI = osp.join(data_root(), 'coco-mini')
SITE = [
    '--site-ann',
    osp.join(MINI, 'reference', 'instances_val2017_coco-mini.json'),
    '--site-img-dir',
    osp.join(MINI, 'images', 'val2017')
]
#: kind -> (config name, CaliDet class, plain class, --cfg-options: small
#: images, few boxes into the NMS: random weights score every box alike)
KINDS = {
    'one-stage':
    ('rtmdet', 'CaliRTMDet', 'RTMDet',
     ['model.test_cfg.nms_pre=100', 'model.test_cfg.max_per_img=20']),
    'two-stage':
    ('faster-rcnn', 'CaliFasterRCNN', 'FasterRCNN',
     ['model.test_cfg.rpn.nms_pre=100', 'model.test_cfg.rpn.max_per_img=20']),
}


@pytest.fixture(scope='module', params=sorted(KINDS))
def detectors(request, tmp_path_factory):
    """The kind's CaliDet and plain configs and random checkpoints."""
    name, cali, plain, options = KINDS[request.param]
    out = tmp_path_factory.mktemp(name)
    found = []
    for config in (f'calidet/calidet_{name}_tiny_coco-mini.py',
                   f'calidet/{name}_tiny_coco-mini.py'):
        model = build_detector(config, seed=0)
        path = str(out / (osp.basename(config)[:-3] + '.pth'))
        save_checkpoint(dict(state_dict=model.state_dict()), path)
        found += [f'configs/{config}', path]
    small = [
        '--device', 'cpu', '--no-progress', '--cfg-options',
        'test_dataloader.dataset.pipeline.1.scale=(128,128)', *options
    ]
    return request.param, cali, plain, found, small


def test_eval_priors_scores_the_detector_and_its_baseline(detectors, tmp_path):
    kind, cali, plain, (config, ckpt, base, base_ckpt), small = detectors
    out = str(tmp_path / 'priors')
    res = run_tool(TOOLS + 'eval_priors.py', config, ckpt, '--baseline-config',
                   base, '--baseline-checkpoint', base_ckpt, '--priors', 'E0',
                   'E_x', '--out-dir', out, '--max-images', '4', *small)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'images; feature cache' in res.stdout
    with open(osp.join(out, 'priors.json')) as f:
        rows = json.load(f)['rows']
    methods = [(r['method'], r['prior']) for r in rows]
    expected = [(cali, p) for p in ('E0', 'E_x')] + [(plain, '-')]
    # the co-occurrence rescoring acts on sigmoid logits only
    corrections = ('marginal re-weighting', 'co-occurrence rescoring') \
        if kind == 'one-stage' else ('marginal re-weighting', )
    expected += [(f'{plain} + {c}', p) for c in corrections
                 for p in ('E0', 'E_x')]
    assert methods == expected
    assert all(0 <= r['AP'] <= 1 for r in rows)
    if kind == 'two-stage':
        res = run_tool(TOOLS + 'eval_priors.py', config, ckpt,
                       '--baseline-config', base, '--baseline-checkpoint',
                       base_ckpt, '--priors', 'E0',
                       '--posthoc', 'cooccurrence', '--out-dir',
                       str(tmp_path / 'refused'), '--max-images', '4', *small)
        assert res.returncode == 1
        lines = res.stderr.strip().splitlines()
        assert lines[-1].startswith(
            'eval_priors.py: error: CooccurrenceRescoring acts on sigmoid '
            'class logits only; FasterRCNN\'s RoI head scores with a softmax')
        assert 'Traceback' not in res.stderr


def test_fit_site_prior_and_self_calibrate_run_on_it(detectors, tmp_path):
    kind, cali, _, (config, ckpt, _, _), small = detectors
    out = str(tmp_path / 'site.json')
    res = run_tool(TOOLS + 'fit_site_prior.py', config, ckpt, *SITE, '--out',
                   out, '--max-images', '4', '--resamples', '10', '--out-dir',
                   str(tmp_path / 'site'), *small)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'fitting on 4 labelled site images' in res.stdout
    prior, meta = load_prior(out, return_meta=True)
    assert prior.shape == (80, 80) and meta['source'] == 'fit_site_prior'
    res = run_tool(TOOLS + 'self_calibrate.py',
                   config, ckpt, '--sizes', '2', '--out-dir',
                   str(tmp_path / 'self'), '--max-images', '4', *small)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(osp.join(tmp_path, 'self', 'self_calibration.json')) as f:
        rows = json.load(f)['summary']
    assert [(r['method'], r['size']) for r in rows] == [(cali, 2)]
