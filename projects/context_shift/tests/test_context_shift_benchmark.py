# Copyright (c) mmcalidet contributors. All rights reserved.
"""projects/context_shift/tools/benchmark.py end to end on a tiny generated
set (a few iterations: the contract, not the accuracy)."""
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmcalidet.calibration import DEFAULT_TRUST_RADIUS
from projects.context_shift.context_shift import make_context_shift
from projects.context_shift.context_shift import training as training_module

pytestmark = pytest.mark.slow

ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PAPER = osp.join('projects', 'context_shift', 'configs',
                 'calidet_dino_tiny_context-shift_cached_paper.py')
SITES = ['like_train', 'left_only', 'crossed', 'swapped']


@pytest.fixture(scope='module')
def bench(tmp_path_factory, benchmark_command_line):
    """One benchmark run (4 DINO iterations, 3 calibrator updates) that the
    tests share (conftest's ``benchmark_command_line``: in this process,
    its two trainings forked from the tool server)."""
    root = tmp_path_factory.mktemp('bench')
    data = str(root / 'data')
    make_context_shift(
        data,
        seed=0,
        num_train=8,
        num_val_per_site=3,
        img_size=64,
        digit_size=(10, 16),
        progress=False)
    args = [
        '--data',
        data,
        '--work-dir',
        str(root / 'work'),
        '--dino-iters',
        '4',
        '--calibrator-updates',
        '3',
        '--self-cal-iters',
        '2',
        '--fit-repeats',
        '2',
        '--score-thr',
        '0',
        '--no-progress',
        # an option that changes the architecture: the evaluation must
        # build the model the training ran (the dumped config); and a
        # constant lr (no milestone within the 3 updates): the report
        # must say what ran, not the default decay
        '--calidet-options',
        'model.bbox_head.califormer.num_layers=2',
        'param_scheduler.0.milestones=[100]'
    ]
    code, log = benchmark_command_line(*args)
    assert code == 0, log[-4000:]
    return root, args, log


def test_benchmark_writes_every_table(bench):
    root, _, log = bench
    out = root / 'work' / 'results'
    with open(out / 'results.json') as f:
        res = json.load(f)
    # both trainings ran: the CaliDINO's CaliFormer learns from the final
    # DINO's cached decoder outputs; the DINO's lr decays at 5/6, the
    # calibrator's milestone was moved past its last update
    assert res['schedule'] == dict(
        dino=4, decay=3, init='cached', start=4, calidet=3, calidet_decay=None)
    dino_ckpt = root / 'work' / 'dino' / 'iter_4.pth'
    assert osp.isfile(dino_ckpt)
    assert osp.isfile(root / 'work' / 'calidet' / 'iter_3.pth')
    train_log = (root / 'work' / 'calidet' / 'train.log').read_text()
    assert 'load_from=' + str(dino_ckpt) in train_log
    # load_from named the cache's detector too (tools/train.py)
    with open(root / 'work' / 'dino' / 'decoder_cache_train' /
              'meta.json') as f:
        assert json.load(f)['checkpoint_path'] == osp.abspath(dino_ckpt)
    # the trainings' and the evaluation's reports went to their logs
    assert 'Iter(train)' not in log and 'mmengine - INFO' not in log
    assert (root / 'work' / 'benchmark.log').stat().st_size > 0
    assert osp.isfile(root / 'work' / 'dino' / 'decoder_cache_train' /
                      'hidden.npy')
    assert 'does not fit the config' not in log
    assert 'one decoder cache serves both' in log
    inj = {(r['method'], r['prior']) for r in res['injection']}
    for prior in ('flip(E_x)', 'E0', 'E_t', 'E_v', 'E_b', 'E_x',
                  'filled flip(E_x)', 'filled E_x'):
        assert ('CaliDINO', prior) in inj
        assert ('DINO + marginal re-weighting', prior) in inj
        assert ('DINO + co-occurrence rescoring', prior) in inj
    assert ('DINO', '-') in inj
    assert res['num_images'] == 3 * len(SITES)
    # per site: CaliDINO under E_t, E_site(in-sample) and the split-half
    # E_site (each half under the other's statistics), each gain with its
    # interval; epsilon of the site's labels
    cali = [r for r in res['sites'] if r['method'] == 'CaliDINO']
    assert [(r['site'], r['prior']) for r in cali] == [
        (s, p) for s in SITES for p in ('E_t', 'E_site(in-sample)', 'E_site')
    ]
    assert all(r['num_images'] == 3 for r in cali)
    for r in cali:
        if r['prior'] == 'E_site':
            assert [h['num_images'] for h in r['halves']] == [2, 1]
        if r['prior'] != 'E_t':
            assert len(r['interval']) == 2
    assert {(m['method'], m['prior'])
            for m in res['site_means']} >= {('CaliDINO', 'E_site'),
                                            ('CaliDINO', 'E_site(in-sample)')}
    # self-calibration: one curve per site and prior-taking method
    assert len(res['self_calibration']) == len(SITES) * 3
    # the deployment rows: per site and method that takes a prior, the raw
    # and the fitted estimate from 2 of the site's 3 images
    takes_prior = {r['method'] for r in res['self_calibration']}
    assert len(res['deployment']) == len(SITES) * len(takes_prior) * 2
    assert {r['prior']
            for r in res['deployment']
            } == {'E_site(2) raw', 'E_site(2) fitted'}
    assert all(len(r['gains']) == r['repeats'] for r in res['deployment'])
    assert all(len(c) == 3 for c in res['curves'].values())
    for r in res['self_calibration']:
        assert r['score_thr'] == 0  # as asked
        assert 0 <= r['AP_estimate'] <= 1
        # the gain is the curve's last AP less its first
        # within the default trust radius
        assert r['radius'] == DEFAULT_TRUST_RADIUS
        curve = res['curves'][f'{r["method"]}, {r["site"]}, radius '
                              f'{DEFAULT_TRUST_RADIUS:g}']
        assert r['gain'] == pytest.approx(curve[-1]['AP'] - curve[0]['AP'])
    # the sweep: per site and prior-taking method, every alpha; alpha 0 is
    # E_t, whose AP the site table has
    # (split-half and in-sample)
    assert len(res['sweep']) == len(SITES) * len(takes_prior) * 6 * 2
    site_ap = {
        (r['site'], r['method']): r['AP']
        for r in res['sites'] if r['prior'] == 'E_t'
    }
    half_ap = {
        (r['site'], r['method']): r['AP_E_t']
        for r in res['sites'] if r['prior'] == 'E_site'
    }
    for r in res['sweep']:
        if r['alpha'] == 0:
            assert r['gain'] == 0
            ap = site_ap if r['prior'] == 'E_site(in-sample)' else half_ap
            assert r['AP'] == pytest.approx(100 * ap[(r['site'], r['method'])])
    # online self-calibration: per site and prior-taking method, streamed;
    # 3 images per site are fewer than the warm-up, so E_c never moves and
    # the stream scores as E_t does on the same images
    assert len(res['online']) == len(SITES) * len(takes_prior)
    for r in res['online']:
        assert r['radius'] == DEFAULT_TRUST_RADIUS and r['updates'] == 0
        assert r['AP_start'] == pytest.approx(site_ap[(r['site'],
                                                       r['method'])])
        assert r['AP_stream'] == pytest.approx(r['AP_start'])
    assert sum(c.startswith('sweep, site')
               for c in res['claims']) == len(SITES)
    assert any('AP(E_t) of CaliDINO vs DINO' in c for c in res['claims'])
    assert res['content_orders']['CaliDINO']['order'] == [
        'filled_flip_E_x', 'E_t', 'filled_E_x'
    ]
    assert any(
        c.startswith('reads relations, CaliDINO') for c in res['claims'])
    # the report shows every table and plot the JSON holds
    md = (out / 'results.md').read_text()
    for site in SITES:
        assert site in md
    for png in ('priors', 'sites', 'sweep', 'subsets', 'self_calibration'):
        assert f'![]({png}.png)' in md
    for png in ['priors', 'sites', 'sweep', 'subsets', 'self_calibration'
                ] + [f'prior_{s}' for s in SITES]:
        assert osp.getsize(out / f'{png}.png') > 1000


def test_benchmark_reuses_trained_checkpoints(bench, run_benchmark):
    _, args, _ = bench
    code, log = run_benchmark(args + ['--train-only'])
    assert code == 0, log[-3000:]
    assert log.count('[train] reusing') == 2
    assert '[data] reusing' in log


def test_benchmark_compares_only_the_chosen_corrections(
        bench, tmp_path, run_benchmark):
    root, args, _ = bench
    out = tmp_path / 'results'
    # the fixture's trainings are reused; only the evaluation runs again
    # (a correction named twice is compared once)
    code, log = run_benchmark(args + [
        '--posthoc', 'reweight', 'reweight', '--out-dir',
        str(out), '--score-thr', '0.2', '--profile'
    ])
    assert code == 0, log[-3000:]
    assert log.count('[train] reusing') == 2
    # --profile: the stages' and tables' seconds, the costliest functions
    profile = (out / 'profile.md').read_text()
    for row in ('| data |', '| train dino |', '| train calidet |',
                '| evaluation |', '| evaluation: injection |',
                '| evaluation: online |'):
        assert row in profile, row
    assert 'evaluate_all' in profile
    with open(out / 'results.json') as f:
        res = json.load(f)
    methods = {r['method'] for r in res['injection']}
    assert methods == {'CaliDINO', 'DINO', 'DINO + marginal re-weighting'}
    assert {r['method']
            for r in res['self_calibration']
            } == {'CaliDINO', 'DINO + marginal re-weighting'}
    assert len(res['self_calibration']) == len(SITES) * 2
    assert 'co-occurrence' not in (out / 'results.md').read_text()
    assert all(r['score_thr'] == 0.2 for r in res['self_calibration'])
    # each site's epsilon is MAE(E_site, E_t), from the written priors
    for r in res['self_calibration']:
        assert 0 <= r['epsilon'] <= 0.5 and 0 <= r['epsilon_end'] <= 0.5


def test_benchmark_fine_tunes_from_a_reused_dino(bench, tmp_path,
                                                 run_benchmark):
    root, _, _ = bench
    work = tmp_path / 'work'
    # the fixture's DINO (4 iterations on the same data) is reused
    code, log = run_benchmark([
        '--data',
        str(root / 'data'), '--work-dir',
        str(work), '--dino-work-dir',
        str(root / 'work' / 'dino'), '--dino-iters', '4', '--finetune-iters',
        '1', '--calidet-init', 'finetune', '--train-only', '--no-progress'
    ])
    assert code == 0, log[-3000:]
    assert log.count('[train] reusing') == 1
    assert 'load_from=' + str(root / 'work' / 'dino' / 'iter_4.pth') in (
        work / 'calidet' / 'train.log').read_text()
    assert osp.isfile(work / 'calidet' / 'iter_1.pth')


def test_benchmark_trains_again_what_ran_with_other_settings(
        bench, tmp_path, monkeypatch, capsys, benchmark_tool):
    root, args, _ = bench
    tool = benchmark_tool
    training = training_module
    # the decision only: a training the benchmark would start is recorded
    launched = []

    class Recorded:

        def __init__(self, cmd, **kwargs):
            launched.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(training, 'launch', Recorded)
    monkeypatch.chdir(ROOT)
    work = str(root / 'work')

    def plan(extra_front=(), extra_options=()):
        launched.clear()
        parsed = tool.parse_args(
            list(extra_front) + args + list(extra_options))
        tool.train_both(parsed, tool.schedule(parsed), work)
        return capsys.readouterr().out

    # the fixture's own settings: both checkpoints are reused
    out = plan()
    assert out.count('[train] reusing') == 2 and not launched
    # another rho: the DINO is reused, the CaliDINO trained again
    out = plan(extra_options=['model.bbox_head.rho=0.5'])
    assert out.count('[train] reusing') == 1
    assert 'was trained with other settings (model differs)' in out
    assert len(launched) == 1 and 'model.bbox_head.rho=0.5' in launched[0]
    # another training seed: both trained again, each seeded with it
    out = plan(extra_front=['--train-seed', '7'])
    assert 'was trained with other settings (randomness differs)' in out
    assert len(launched) == 2
    assert all('randomness.seed=7' in cmd for cmd in launched)
    # another calibrator config in the same folder: trained with it, not
    # the checkpoint of the default config taken for it
    filled = PAPER
    out = plan(extra_front=['--calibrator-config', filled])
    assert 'was trained with other settings (model differs)' in out
    assert len(launched) == 1 and filled in launched[0]
    # a checkpoint that keeps no config (rebuilt from its weights) is
    # compared through the config dumped beside it; without one, nothing is
    # overwritten
    bare = tmp_path / 'bare'
    bare.mkdir()
    torch.save(dict(state_dict={}), str(bare / 'iter_3.pth'))
    launched.clear()
    with pytest.raises(
            ValueError,
            match='keeps no config and no calidet_'
            'dino_tiny_context-shift_cached_paper.py was dumped'):
        training.Training(filled, str(bare), 3, [], False, str(root / 'data'))
    assert not launched
    monkeypatch.setenv('MMCALIDET_CS_DATA', osp.realpath(root / 'data'))
    dumped = Config.fromfile(filled)
    dumped.dump(str(bare / osp.basename(filled)))
    # a dumped config that does not record its data: trained again
    training.Training(filled, str(bare), 3, [], False, str(root / 'data'))
    assert 'other data (no record of its data)' in capsys.readouterr().out
    assert len(launched) == 1
    launched.clear()
    # one that records it (as tools/train.py dumps a benchmark training's)
    dumped[training.DATA_KEY] = training.data_identity(str(root / 'data'))
    dumped.dump(str(bare / osp.basename(filled)))
    training.Training(filled, str(bare), 3, [], False, str(root / 'data'))
    assert f'[train] reusing {bare}' in capsys.readouterr().out
    training.Training(filled, str(bare), 3, ['model.bbox_head.rho=0.5'], False,
                      str(root / 'data'))
    assert 'other settings (model differs)' in capsys.readouterr().out
    assert len(launched) == 1 and launched[0][2] == filled
    # a checkpoint that cannot be read is trained over
    (bare / 'iter_3.pth').write_bytes(b'PK\x03\x04 half a zip')
    training.Training(filled, str(bare), 3, [], False, str(root / 'data'))
    assert 'iter_3.pth cannot be read (' in capsys.readouterr().out
    assert len(launched) == 2


def test_benchmark_trains_the_chosen_calibrator_config(bench, tmp_path,
                                                       run_benchmark):
    root, _, _ = bench
    work = tmp_path / 'work'
    config = PAPER
    code, log = run_benchmark([
        '--data',
        str(root / 'data'), '--work-dir',
        str(work), '--dino-work-dir',
        str(root / 'work' / 'dino'), '--dino-iters', '4',
        '--calibrator-updates', '2', '--calibrator-config', config,
        '--train-only', '--no-progress'
    ])
    assert code == 0, log[-3000:]
    # the fixture's DINO is reused; the calibrator trains the paper's
    # recipe (LoMa on every query) for the benchmark's updates
    assert log.count('[train] reusing') == 1
    assert osp.isfile(work / 'calidet' / 'iter_2.pth')
    dumped = (work / 'calidet' / osp.basename(config)).read_text()
    assert "loma_queries='all'" in dumped
