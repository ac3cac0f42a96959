# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/train.py, tools/test.py and ``mim train`` on the tiny CaliDet."""
import copy
import glob
import os
import os.path as osp
import re
import runpy
import subprocess
import sys

import mmengine
import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import (find_latest_checkpoint, load_checkpoint,
                             save_checkpoint)

from mmcalidet.priors import sample_prior
from testing import (PROJECT_ROOT, build_detector, data_root, demo_batch,
                     get_config, run_tool)

pytestmark = pytest.mark.slow

CONFIG = 'configs/calidet/calidet_dino_tiny_coco-mini.py'
FEW_ITERS = [
    'train_cfg.max_iters=2', 'train_cfg.val_interval=2',
    'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1',
    'val_dataloader.dataset.indices=2', 'randomness.seed=0'
]


def run(args, timeout=300, threads=None):
    if args[0] == sys.executable:  # a project script: as run_tool runs it
        proc = run_tool(*args[1:], threads=threads, timeout=timeout)
    else:
        env = dict(os.environ, MMCALIDET_DATA=data_root())
        if threads:
            env.update(
                OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        proc = subprocess.run(
            args,
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    return output


def losses_logged(output):
    return [
        float(v)
        for v in re.findall(r'Iter\(train\).*?  loss: ([\d.]+)', output)
    ]


def mim_train_script():
    """Where mim 0.3.9 looks for the package's train.py."""
    from mim.utils import get_installed_path
    return osp.join(
        get_installed_path('mmcalidet'), '.mim', 'tools', 'train.py')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """Fine-tune from a plain DINO checkpoint, as the paper's recipe, the
    way users start it: ``mim train mmcalidet CONFIG``."""
    work_dir = str(tmp_path_factory.mktemp('train'))
    register_all_modules()
    # a fixed init: the run is then the same on every machine. init_weights
    # matters: mmdet creates DINO's level_embed uninitialised
    # (torch.Tensor(...)), so a model saved straight from MODELS.build can
    # hold NaN or 1e35 there, and the fine-tune then meets NaN logits
    torch.manual_seed(0)
    dino = MODELS.build(get_config('calidet/dino_tiny_coco-mini.py').model)
    dino.init_weights()
    dino_file = osp.join(work_dir, 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    # mim 0.3.9 looks for <dist location>/mmcalidet/.mim/tools/train.py; a
    # PEP 660 editable install (pip install -e .) puts no package there
    assert osp.isfile(mim_train_script()), \
        f'mim cannot find {mim_train_script()}'
    mim = osp.join(osp.dirname(sys.executable), 'mim')
    output = run(
        [
            mim, 'train', 'mmcalidet', CONFIG, '--gpus', '0', '--work-dir',
            work_dir, '--cfg-options', f'load_from={dino_file}', *FEW_ITERS
        ],
        # one thread: the same arithmetic on every run
        threads=1)
    return work_dir, output


def test_train_runs_a_few_iterations(trained):
    work_dir, output = trained
    # the DINO weights load; the new ones are reported, nothing unexpected
    report = re.search(r'missing keys in source state_dict: (.*)', output)
    assert report, output[-3000:]
    missing = report.group(1).split(', ')
    assert 'prior' in missing and 'bbox_head.califormer.nodes' in missing
    assert all(k == 'prior' or k.startswith('bbox_head.califormer.')
               for k in missing)
    assert 'unexpected key' not in output
    assert len(losses_logged(output)) == 2
    assert 'loss_loma' in output and 'd0.loss_loma' in output
    assert 'coco/bbox_mAP' in output  # validation on 2 images ran
    assert osp.isfile(osp.join(work_dir, 'iter_2.pth'))


def test_checkpoint_loads_in_a_fresh_model_with_weights_only(trained):
    work_dir, _ = trained
    # torch's default weights_only=True: mmengine's message hub is allowed
    checkpoint = torch.load(osp.join(work_dir, 'iter_2.pth'))
    assert {'state_dict', 'message_hub', 'optimizer'} <= set(checkpoint)
    register_all_modules()
    model = MODELS.build(
        get_config('calidet/calidet_dino_tiny_coco-mini.py').model)
    model.init_weights()
    load_checkpoint(model, osp.join(work_dir, 'iter_2.pth'), strict=True)
    torch.testing.assert_close(model.prior, checkpoint['state_dict']['prior'])
    model.eval()
    data = model.data_preprocessor(demo_batch([[1]], size=64), False)
    with torch.no_grad():
        result = model.predict(data['inputs'],
                               copy.deepcopy(data['data_samples']))
    assert len(result[0].pred_instances) == 30


def test_resume_continues_training(trained):
    work_dir, _ = trained
    output = run([
        sys.executable, 'tools/train.py', CONFIG, '--work-dir', work_dir,
        '--resume', '--cfg-options',
        *[o
          for o in FEW_ITERS if 'max_iters' not in o], 'train_cfg.max_iters=3',
        'train_cfg.val_interval=100', 'train_cfg.val_begin=100'
    ])
    assert 'resumed epoch: 0, iter: 2' in output
    assert re.search(r'Iter\(train\) \[3/3\]', output)


@pytest.fixture(scope='module')
def tested(trained, tmp_path_factory):
    """tools/test.py on the trained checkpoint: with its own prior (and
    ``--show-dir``) and with an injected one."""
    work_dir, _ = trained
    tmp_path = tmp_path_factory.mktemp('test')
    prior_file = str(tmp_path / 'prior.npy')
    np.save(prior_file, sample_prior(80, [0, 2]))
    runs = {}
    for name, extra in (('own', ['--show-dir',
                                 'vis']), ('injected', ['--prior',
                                                        prior_file])):
        out_file = str(tmp_path / f'{name}.pkl')
        output = run([
            sys.executable, 'tools/test.py', CONFIG,
            find_latest_checkpoint(work_dir), '--work-dir',
            str(tmp_path / name), '--out', out_file, *extra, '--cfg-options',
            'test_dataloader.dataset.indices=2'
        ])
        runs[name] = (tmp_path / name, out_file, output)
    return runs


def test_test_tool_with_an_injected_prior(tested):
    scores = {}
    for name, (_, out_file, output) in tested.items():
        assert 'coco/bbox_mAP' in output
        assert f'results renamed to {out_file}' in output
        scores[name] = torch.cat(
            [r['pred_instances']['scores'] for r in mmengine.load(out_file)])
    # the prior is injected after the checkpoint (which has its own) loads
    assert not torch.allclose(scores['own'], scores['injected'])


def test_test_tool_show_dir_draws_the_test_images(tested):
    # mmdet's --show-dir: the visualization hook draws every test image
    work_dir, _, _ = tested['own']
    drawn = sorted(glob.glob(str(work_dir / '*' / 'vis' / '*.jpg')))
    assert len(drawn) == 2
    for path in drawn:
        with open(path, 'rb') as f:
            assert f.read(2) == b'\xff\xd8'  # a JPEG
    # only where asked
    injected_dir, _, _ = tested['injected']
    assert not glob.glob(str(injected_dir / '*' / 'vis'))


def test_mim_train(trained):
    # the module's training ran through `mim train mmcalidet`: mim found
    # the package's tools and the run logged as tools/train.py does
    work_dir, output = trained
    assert osp.isfile(mim_train_script())
    assert len(losses_logged(output)) == 2
    assert glob.glob(osp.join(work_dir, '*', 'vis_data'))


def test_nan_weights_stop_training_with_one_line(tmp_path, monkeypatch,
                                                 capsys):
    # a DINO checkpoint whose level_embed holds NaN (what an uninitialised
    # one can hold): the fine-tune used to die in scipy's matcher (in this
    # process, through the command line's error handling: what is checked
    # is the error, not the start-up)
    register_all_modules()
    torch.manual_seed(0)
    dino = MODELS.build(get_config('calidet/dino_tiny_coco-mini.py').model)
    dino.init_weights()
    with torch.no_grad():
        dino.level_embed[0, :8] = float('nan')
    dino_file = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    code = train_in_process([
        CONFIG, '--work-dir',
        str(tmp_path / 'work'), '--cfg-options', f'load_from={dino_file}',
        *FEW_ITERS
    ], monkeypatch)
    out, err = capsys.readouterr()
    assert code == 1, err[-3000:]
    assert 'Traceback' not in err
    assert 'invalid numeric entries' not in out + err
    # one line, as argparse's errors: where it stopped and what is NaN
    last = err.strip().splitlines()[-1]
    match = re.match(
        r'train\.py: error: non-finite head outputs at iteration (\d+) '
        r'.*?: (.*); inputs: decoder hidden states (finite|not finite), '
        r"V' \(CaliFormer output\) (finite|not finite); weights: (.*); "
        r'images: (finite|not finite)$', last)
    assert match, last
    iteration, parts, hidden, v_prime, weights, images = match.groups()
    assert iteration == '1'
    assert parts.startswith('decoder layer 0 logits (')
    # everything downstream of the encoder is NaN, the CaliFormer is not
    assert (hidden, v_prime) == ('not finite', 'finite')
    # and the error names the weight that made it so
    assert re.fullmatch(r'1 of \d+ tensors not finite \(level_embed\)',
                        weights), weights
    assert images == 'finite'
    assert not glob.glob(str(tmp_path / 'work' / '*.pth'))


def train_in_process(args, monkeypatch) -> int:
    """tools/train.py's ``main`` run in this process as ``run_tool`` runs
    it (from the project root, the shared data): its exit status."""
    from mmcalidet.utils.cli import run_tool
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    monkeypatch.setattr(sys, 'argv', ['tools/train.py'])
    train = runpy.run_path(
        osp.join(PROJECT_ROOT, 'tools', 'train.py'), run_name='tool')
    with pytest.raises(SystemExit) as info:
        run_tool(train['main'], args, errors=train['ERRORS'])
    code = info.value.code
    if isinstance(code, str):  # sys.exit(message): Python prints it, exits 1
        print(code, file=sys.stderr)
        return 1
    return code


def test_a_cache_of_more_classes_stops_with_one_line(tmp_path, monkeypatch,
                                                     capsys):
    """An 80-class decoder cache for a 10-class calibrator failed with a
    traceback at the first step (a label out of range): one line naming
    the cache and both class counts, before the first iteration."""
    dino = build_detector('calidet/dino_tiny_coco-mini.py', seed=0)
    dino_file = str(tmp_path / 'dino.pth')
    save_checkpoint(dict(state_dict=dino.state_dict()), dino_file)
    prior10 = str(tmp_path / 'prior10.npy')
    np.save(prior10, np.eye(10))
    cache = str(tmp_path / 'cache')
    # a 10-class fine-tune of the 80-class baseline's weights
    fine_tune = str(tmp_path / 'fine_tune.py')
    with open(fine_tune, 'w') as f:
        f.write(f"_base_ = '{PROJECT_ROOT}/configs/calidet/"
                "calidet_dino_tiny_coco-mini_cached.py'\n"
                "custom_hooks = [dict(type='CheckpointCompatHook', "
                'allow_shape_mismatch=True)]\n')
    code = train_in_process([
        fine_tune, '--work-dir',
        str(tmp_path / 'work'), '--cfg-options', f'load_from={dino_file}',
        f'train_dataloader.dataset.cache_dir={cache}',
        'train_dataloader.dataset.source.indices=[0,1]',
        'train_dataloader.dataset.source.progress=False',
        'model.bbox_head.num_classes=10', f'model.prior={prior10}',
        'train_cfg.max_iters=2', 'train_cfg.val_begin=1000'
    ], monkeypatch)
    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        f'train.py: error: the training set (DecoderCacheDataset {cache}) '
        'has 80 classes, the model\'s head 10 '), last
    assert not glob.glob(str(tmp_path / 'work' / '*.pth'))


def test_a_cache_of_another_detector_is_refused_before_anything_is_built(
        tmp_path, monkeypatch, capsys):
    """``load_from=A.pth`` with ``source.checkpoint=B.pth`` trained a
    calibrator that kept A's decoder and learned B's outputs (exit 0): one
    line naming both, before a cache or a checkpoint is written."""
    files = []
    for seed in (0, 1):
        dino = build_detector('calidet/dino_tiny_coco-mini.py', seed=seed)
        files.append(str(tmp_path / f'dino_{seed}.pth'))
        save_checkpoint(dict(state_dict=dino.state_dict()), files[-1])
    cache = str(tmp_path / 'cache')
    code = train_in_process([
        'configs/calidet/calidet_dino_tiny_coco-mini_cached.py', '--work-dir',
        str(tmp_path / 'work'), '--cfg-options', f'load_from={files[0]}',
        f'train_dataloader.dataset.source.checkpoint={files[1]}',
        f'train_dataloader.dataset.cache_dir={cache}'
    ], monkeypatch)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f'train.py: error: load_from {files[0]} is not the detector the '
        f'decoder cache is made from ({files[1]}'), err[-1]
    assert not osp.exists(cache) and not osp.exists(tmp_path / 'work')
