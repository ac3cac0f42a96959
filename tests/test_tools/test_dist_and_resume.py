# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/dist_train.sh on CPU (gloo), and resuming after a SIGKILL.

The runs load probes (``_train_probes.py`` beside this file) through a
small config that inherits the tiny config under test.
"""
import glob
import importlib.util
import os
import os.path as osp
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config

import mmcalidet  # noqa: F401  (checkpoint types for torch.load)
from mmcalidet.priors import batch_prior
from mmcalidet.utils.cpu_dist import init_cpu_distributed
from testing import PROJECT_ROOT, data_root, popen_tool

HERE = osp.dirname(osp.abspath(__file__))
# no validation (not even the final one), small images
FAST = [
    'train_cfg.val_begin=1000', 'default_hooks.logger.interval=1',
    'randomness.seed=0', 'train_dataloader.dataset.pipeline.3.scale=(64,64)'
]


def start(args, **extra_env):
    env = dict(
        os.environ,
        MMCALIDET_DATA=data_root(),
        OMP_NUM_THREADS='1',
        PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([HERE,
                                    os.environ.get('PYTHONPATH', '')]),
        **extra_env)
    # a project script forks from the tool server (the probes' folder is
    # new modules before its PYTHONPATH); dist_train.sh is a new process
    return popen_tool(
        args,
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)


def finish(proc, returncode=0, timeout=300):
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == returncode, output[-5000:]
    return output


def train(*args):
    return start([sys.executable, 'tools/train.py', *args])


def probe_config(path, base, hooks, **extra):
    """A config inheriting ``configs/<base>`` with the probes loaded
    beside the base's own imports (the runs it is compared with have
    them)."""
    lines = [
        f'_base_ = {osp.join(PROJECT_ROOT, "configs", base)!r}',
        'custom_imports = dict(imports=_base_.custom_imports["imports"] + '
        '["_train_probes"], allow_failed_imports=False)',
        f'custom_hooks = {hooks!r}'
    ] + [f'{k} = {v!r}' for k, v in extra.items()]
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def losses(output):
    return {
        int(i): float(v)
        for i, v in re.findall(
            r'Iter\(train\) \[\s*(\d+)/\d+\].*?  loss: ([\d.]+)', output)
    }


@pytest.mark.slow
def test_two_processes_agree_and_edges_are_global(tmp_path):
    base = 'calidet/calidet_deformable-detr_tiny_coco-mini.py'
    augment = Config.fromfile(osp.join(PROJECT_ROOT, 'configs', base)) \
        .model.data_preprocessor.batch_augments[0].to_dict()
    # E_b only, without noise: each sample's prior is exactly E_b; over the
    # global batch (the default, 'local', is each rank's own mini-batch)
    augment.update(
        mode_probs=dict(batch=1.0), noise_std=0.0, batch_scope='global')
    config = probe_config(
        tmp_path / 'dist.py',
        base, [
            dict(type='IterationSeedHook'),
            dict(type='PriorClassesHook'),
            dict(type='RankDumpHook')
        ],
        model=dict(data_preprocessor=dict(batch_augments=[augment])))
    work_dir = tmp_path / 'work'
    output = finish(
        start([
            'bash', 'tools/dist_train.sh', config, '2', '--work-dir',
            str(work_dir), '--cfg-options', *FAST, 'train_cfg.max_iters=2',
            'default_hooks.checkpoint.interval=2'
        ],
              PORT=str(free_port())),
        timeout=400)
    assert 'Distributed training: True' in output
    assert re.search(r'Iter\(train\) \[2/2\]', output)
    ranks = [torch.load(str(work_dir / f'rank{r}.pth')) for r in (0, 1)]

    # both ranks end with the same weights, and rank 0 saved them
    saved = torch.load(str(work_dir / 'iter_2.pth'))['state_dict']
    for key, value in ranks[0]['state_dict'].items():
        assert torch.equal(value, ranks[1]['state_dict'][key]), key
        assert torch.equal(value, saved[key]), key

    # E_b is over the global batch (both ranks' images), not a rank's own
    local_differs = False
    records = list(zip(ranks[0]['records'], ranks[1]['records']))
    assert len(records) == 2
    for mine, other in records:
        assert mine['mode'] == other['mode'] == 'batch'
        labels = [lab.numpy() for lab in mine['labels'] + other['labels']]
        assert len(labels) == 4  # 2 processes x 2 images
        global_prior = batch_prior(80, labels)
        for record in (mine, other):
            for prior in record['priors'].numpy():
                np.testing.assert_allclose(prior, global_prior, atol=1e-6)
        local = batch_prior(80, [lab.numpy() for lab in mine['labels']])
        local_differs |= not np.allclose(local, global_prior, atol=1e-6)
    assert local_differs


@pytest.mark.slow
def test_kill_while_saving_then_resume_equals_uninterrupted(tmp_path):
    # DINO draws random denoising queries every iteration
    base = 'calidet/calidet_dino_tiny_coco-mini.py'
    # the config's num_workers=0: the pipeline's augmentation runs in the
    # main process, seeded by IterationSeedHook before each batch is
    # fetched (with workers: tests/test_engine/test_iteration_seed.py)
    options = [
        *FAST, 'train_cfg.max_iters=4', 'default_hooks.checkpoint.interval=2'
    ]
    whole, killed = tmp_path / 'whole', tmp_path / 'killed'
    killer = probe_config(tmp_path / 'kill.py', base, [
        dict(type='IterationSeedHook'),
        dict(type='PriorClassesHook'),
        dict(type='KillHook', iteration=4, during_save=True)
    ])
    config = osp.join('configs', base)
    # the uninterrupted run and the run that dies at once, side by side
    runs = [
        train(config, '--work-dir', str(whole), '--cfg-options', *options),
        train(killer, '--work-dir', str(killed), '--cfg-options', *options)
    ]
    finish(runs[1], returncode=-signal.SIGKILL)

    # killed while iter_4.pth was half-written: iter_2.pth and the pointer
    # to it are intact (max_keep_ckpts=1 has not removed it yet)
    assert (killed / 'last_checkpoint').read_text() == \
        str(killed / 'iter_2.pth')
    assert not (killed / 'iter_4.pth').exists()
    assert glob.glob(str(killed / 'iter_4.pth.incomplete-*.tmp'))
    checkpoint = torch.load(str(killed / 'iter_2.pth'))  # weights_only
    assert checkpoint['meta']['iter'] == 2

    resumed = finish(
        train(config, '--work-dir', str(killed), '--resume', '--cfg-options',
              *options))
    reference = finish(runs[0])
    assert 'resumed epoch: 0, iter: 2' in resumed
    assert 'an incomplete checkpoint of an interrupted run' in resumed
    assert not glob.glob(str(killed / '*.incomplete-*.tmp'))
    assert sorted(glob.glob(str(killed / '*.pth'))) == \
        [str(killed / 'iter_4.pth')]
    # the same losses for iterations 3 and 4, and the same final weights
    assert losses(resumed) == {
        i: v
        for i, v in losses(reference).items() if i > 2
    }
    a = torch.load(str(whole / 'iter_4.pth'))
    b = torch.load(str(killed / 'iter_4.pth'))
    assert a['state_dict'].keys() == b['state_dict'].keys()
    for key, value in a['state_dict'].items():
        assert torch.equal(value, b['state_dict'][key]), key
    for x, y in zip(a['optimizer']['state'].values(),
                    b['optimizer']['state'].values()):
        assert torch.equal(x['exp_avg'], y['exp_avg'])


def load_train_tool():
    spec = importlib.util.spec_from_file_location(
        'train_tool', osp.join(PROJECT_ROOT, 'tools', 'train.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU behaviour')
def test_cpu_launchers_and_the_compat_hook():
    cfg = Config(dict(launcher='none'))
    assert not init_cpu_distributed(cfg)  # nothing to do
    assert 'model_wrapper_cfg' not in cfg
    for launcher in ('slurm', 'mpi'):
        with pytest.raises(RuntimeError) as info:
            init_cpu_distributed(Config(dict(launcher=launcher)))
        assert str(info.value) == (
            f'--launcher {launcher} needs GPUs; on CPU, start the processes '
            'with torchrun (tools/dist_train.sh), i.e. --launcher pytorch')
    tool = load_train_tool()
    cfg = Config(dict(custom_hooks=[dict(type='IterationSeedHook')]))
    tool.add_checkpoint_compat_hook(cfg)
    tool.add_checkpoint_compat_hook(cfg)
    assert [h['type'] for h in cfg.custom_hooks] == \
        ['IterationSeedHook', 'CheckpointCompatHook']
