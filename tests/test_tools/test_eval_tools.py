# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/{eval_priors,eval_subsets,self_calibrate}.py on
the tiny configs (random weights: contracts, not accuracy). The heavy
runs call the tools' ``main`` in-process; exit codes are checked in a
subprocess. The CaliDINO checkpoint's scores are known
(``set_known_scores``: every image predicts classes 1 and 2 with scores
>= 0.9, nothing else scores over 0.01)."""
import json
import os.path as osp
import re
import runpy

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope
from mmengine.runner import save_checkpoint

from mmcalidet.priors import load_prior
from testing import (PROJECT_ROOT, get_config, run_tool_in_process,
                     set_known_scores)

CALI = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
DINO = 'configs/calidet/dino_tiny_coco-mini.py'
SMALL = [
    '--max-images', '4', '--device', 'cpu', '--no-progress', '--cfg-options',
    'test_dataloader.dataset.pipeline.1.scale=(96,96)'
]
PNG = b'\x89PNG\r\n\x1a\n'


def tool(name):
    """A tool's ``main`` (loaded without running it)."""
    path = osp.join(PROJECT_ROOT, 'tools', 'analysis_tools', f'{name}.py')
    return runpy.run_path(path, run_name='tool')['main']


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    init_default_scope('mmdet')
    out = tmp_path_factory.mktemp('ckpt')
    paths = []
    for config, name in ((CALI, 'cali.pth'), (DINO, 'dino.pth')):
        torch.manual_seed(0)
        model = MODELS.build(get_config(config.split('configs/')[1]).model)
        model.init_weights()
        if config == CALI:
            set_known_scores(model, (1, 2))
        path = str(out / name)
        save_checkpoint(dict(state_dict=model.state_dict()), path)
        paths.append(path)
    return paths


def check_png(path):
    with open(path, 'rb') as f:
        assert f.read(8) == PNG


@pytest.mark.slow
def test_eval_priors_with_baseline(checkpoints, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(PROJECT_ROOT)
    cali, dino = checkpoints
    out = str(tmp_path / 'priors')
    logger = MMLogger.get_current_instance()
    level = logger.level
    assert tool('eval_priors')([
        CALI, cali, '--baseline-config', DINO, '--baseline-checkpoint', dino,
        '--out-dir', out, '--priors', 'flip_E_x', 'E0', 'E_t', 'E_v', 'E_b',
        'E_x', 'val=coco2017_val', *SMALL
    ]) == 0
    # the evaluation quiets mmengine while it builds the models, not after
    assert logger.level == level
    with open(osp.join(out, 'priors.json')) as f:
        report = json.load(f)
    rows = report['rows']
    names = ['flip(E_x)', 'E0', 'E_t', 'E_v', 'E_b', 'E_x', 'val']
    assert [(r['method'], r['prior'])
            for r in rows] == [('CaliDINO', p) for p in names] + [
                ('DINO', '-')
            ] + [(f'DINO + {c}', p)
                 for c in ('marginal re-weighting', 'co-occurrence rescoring')
                 for p in names]
    assert [r['oracle'] for r in rows[:7]
            ] == [True, False, False, True, True, True, False]
    orders = report['expected_order']
    assert set(orders) == {
        'CaliDINO', 'DINO + marginal re-weighting',
        'DINO + co-occurrence rescoring'
    }
    order = orders['CaliDINO']
    assert order['order'] == ['flip_E_x', 'E0', 'E_t', 'E_v', 'E_b', 'E_x']
    aps = {r['prior']: r['AP'] for r in rows if r['method'] == 'CaliDINO'}
    aps = [aps[p] for p in names[:-1]]
    if max(aps) == min(aps):  # e.g. random weights' all-zero APs
        assert order['holds'] is None
        assert order['verdict'].startswith('undecidable (all APs within')
    else:
        assert order['holds'] == (all(
            a <= b for a, b in zip(aps, aps[1:])) and aps[-1] > aps[0])
    assert report['info']['num_images'] == 4
    assert report['info']['eval_batch_size'] == 2
    # the Markdown table holds the JSON's rows: method, prior, oracle, AP
    with open(osp.join(out, 'priors.md')) as f:
        text = f.read()
    cells = [[c.strip() for c in line.strip('|').split('|')]
             for line in text.splitlines() if line.startswith('| ')]
    header, table = cells[0], cells[1:]
    assert header[:4] == ['method', 'prior', 'oracle', 'AP']
    assert [c[:4] for c in table] == [[
        r['method'], r['prior'], 'yes' if r['oracle'] else '',
        f'{100 * r["AP"]:.2f}'
    ] for r in rows]
    # and a line per expected order, with its verdict
    for method in orders:
        assert re.search(rf'^- {re.escape(method)}: .*\*\*.+\*\*$', text,
                         re.M), method
    check_png(osp.join(out, 'priors.png'))
    console = capsys.readouterr().out
    assert 'Expected order' in console
    # what pycocotools and mmengine print while the models load goes to
    # the log in the output folder, not the console
    with open(osp.join(out, 'eval.log')) as f:
        log = f.read()
    for line in ('creating index', 'Loads checkpoint'):
        assert line in log and line not in console


def test_eval_priors_order_tol_is_checked(capsys):
    path = osp.join(PROJECT_ROOT, 'tools', 'analysis_tools', 'eval_priors.py')
    parse_args = runpy.run_path(path, run_name='tool')['parse_args']
    assert parse_args([CALI, 'none', '--order-tol', '0.1']).order_tol == 0.1
    with pytest.raises(SystemExit):
        parse_args([CALI, 'none', '--order-tol', '-1'])
    assert "--order-tol: a finite number >= 0, got '-1'" in \
        capsys.readouterr().err


def test_epsilon_only_reproduces_the_notes(datasets_dir, tmp_path):
    """ε on all 5,000 COCO val2017 images (48 without labels), seed 0:
    the figures of ../shared/paper/notes.md (80 classes)."""
    labels = osp.join(datasets_dir, 'coco2017-labels')
    out = str(tmp_path / 'eps')
    assert tool('eval_subsets')([
        '--epsilon-only', '--labels',
        osp.join(labels, 'labels_val2017.tar.gz'), '--classes',
        osp.join(labels, 'classes.json'), '--image-list',
        osp.join(labels, 'val2017_image_sizes.json'), '--out-dir', out,
        '--no-progress'
    ]) == 0
    with open(osp.join(out, 'subsets.json')) as f:
        report = json.load(f)
    assert report['num_images'] == 5000
    assert report['images_without_objects'] == 48
    eps = [round(r['epsilon'], 3) for r in report['rows']]
    assert eps == [0.374, 0.312, 0.230, 0.141, 0.074, 0.043]
    assert [r['num_subsets']
            for r in report['rows']] == [625, 312, 156, 78, 39, 19]
    check_png(osp.join(out, 'subsets.png'))


@pytest.mark.slow
def test_eval_subsets_and_self_calibrate(checkpoints, tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    cali, _ = checkpoints
    out = str(tmp_path / 'subsets')
    assert tool('eval_subsets')(
        [CALI, cali, '--sizes', '2', '8', '--out-dir', out, *SMALL]) == 0
    with open(osp.join(out, 'subsets.json')) as f:
        rows = json.load(f)['rows']
    assert [(r['size'], r['prior']) for r in rows] == [(2, 'E_t'), (2, 'E_b')]
    assert rows[0]['epsilon'] == 0 and 0 < rows[1]['epsilon'] < 1
    assert 'gain_AP' in rows[1]
    with open(osp.join(out, 'subsets.md')) as f:
        text = f.read()
    assert '| gain |' in text and 'Sizes [8] exceed' in text

    out = str(tmp_path / 'selfcal')
    prior_file = str(tmp_path / 'e_c.json')
    # max_per_img: 30 queries x 2 classes, every high score is kept
    # --trust-radius none: the paper's unbounded loop
    assert tool('self_calibrate')([
        CALI, cali, '--sizes', '0', '--iters', '2', '--tol', '0', '--out-dir',
        out, '--save-prior', prior_file, '--trust-radius', 'none', *SMALL,
        'model.test_cfg.max_per_img=60'
    ]) == 0
    with open(osp.join(out, 'self_calibration.json')) as f:
        report = json.load(f)
    assert [r['iter'] for r in report['curves']] == [0, 1, 2]
    assert report['summary'][0]['size'] == 4
    assert report['summary'][0]['subsets'] == 1
    prior, meta = load_prior(prior_file, return_meta=True)
    assert prior.shape == (80, 80) and len(meta['classes']) == 80
    e_t = load_prior(
        osp.join(PROJECT_ROOT, 'mmcalidet', 'data', 'priors',
                 'coco2017_train.json'))
    # every image predicts classes 1 and 2 (scores >= 0.9): E_i's columns
    # 1 and 2 are the indicator of {1, 2} and Z is 0 in the other columns;
    # eta * Z >= 4 * 0.9 > 1 takes columns 1 and 2 past E_i and the clip
    # lands them on it, the other columns keep E_t
    indicator = np.isin(np.arange(80), (1, 2)).astype(float)
    others = np.setdiff1d(np.arange(80), (1, 2))
    np.testing.assert_allclose(prior[:, others], e_t[:, others], atol=1e-6)
    for j in (1, 2):
        np.testing.assert_allclose(prior[:, j], indicator, atol=1e-6)
    assert np.abs(prior - e_t).max() > 0.5
    check_png(osp.join(out, 'self_calibration.png'))
    # the trust region: E_c within the asked mean distance of E_t
    radius = float(np.abs(prior - e_t).mean()) / 4
    assert tool('self_calibrate')([
        CALI, cali, '--sizes', '0', '--iters', '2', '--tol', '0', '--out-dir',
        out, '--save-prior', prior_file, '--trust-radius', f'{radius!r}',
        *SMALL, 'model.test_cfg.max_per_img=60'
    ]) == 0
    held = load_prior(prior_file)
    assert np.abs(held - e_t).mean() == pytest.approx(radius, rel=1e-4)


@pytest.mark.slow
def test_errors_exit_with_one_line(tmp_path):
    proc = run_tool_in_process('tools/analysis_tools/eval_priors.py', CALI,
                               str(tmp_path / 'missing.pth'), '--out-dir',
                               str(tmp_path), '--device', 'cpu')
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('eval_priors.py: error: checkpoint not found')


def test_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        tool('eval_subsets')(['--sizes', '8'])
    assert exc.value.code == 2
    assert 'pass CONFIG and CHECKPOINT' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool('eval_subsets')(['--epsilon-only'])
    assert '--epsilon-only needs --labels' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool('self_calibrate')(
            ['c.py', 'c.pth', '--sizes', '8', '--save-prior', 'p.json'])
    assert '--save-prior needs --sizes 0' in capsys.readouterr().err
    for bad in ('2', 'nan', 'fit'):
        with pytest.raises(SystemExit):
            tool('self_calibrate')(['c.py', 'c.pth', '--score-thrs', bad])
        assert 'a number in [0, 1]' in capsys.readouterr().err
