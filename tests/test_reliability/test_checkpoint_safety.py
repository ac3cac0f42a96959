# Copyright (c) mmcalidet contributors. All rights reserved.
"""Checkpoints: atomic writes, the order of save / pointer / clean-up, and
checkpoints that do not fit the model (DINO <-> CaliDINO, class count)."""
import copy
import glob
import importlib.util
import os
import os.path as osp
import re
import sys
from types import SimpleNamespace

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.fileio import LocalBackend
from mmengine.logging import MMLogger
from mmengine.model import BaseModel
from mmengine.runner import Runner, save_checkpoint

from mmcalidet.engine.checkpoint_hooks import (AtomicCheckpointHook,
                                               AtomicLocalBackend,
                                               CheckpointCompatHook)
from mmcalidet.utils.checkpoint_compat import (CheckpointMismatchError,
                                               check_checkpoint)
from testing import PROJECT_ROOT, data_root, get_config, run_tool_in_process

register_all_modules()


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_atomic_backend_keeps_the_old_file_when_a_write_fails(
        tmp_path, monkeypatch):
    backend = AtomicLocalBackend()
    path = tmp_path / 'iter_1.pth'
    backend.put(b'complete checkpoint', str(path))
    backend.put_text('iter_1.pth', str(tmp_path / 'last_checkpoint'))

    class Full:

        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:3])  # a part reaches the disk, then ...
            raise OSError(28, 'No space left on device')

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    real_fdopen = os.fdopen
    monkeypatch.setattr(os, 'fdopen',
                        lambda *a, **k: Full(real_fdopen(*a, **k)))
    with pytest.raises(OSError, match='No space left on device'):
        backend.put(b'new checkpoint', str(path))
    with pytest.raises(OSError, match='No space left on device'):
        backend.put_text('iter_2.pth', str(tmp_path / 'last_checkpoint'))
    monkeypatch.undo()
    assert path.read_bytes() == b'complete checkpoint'
    assert (tmp_path / 'last_checkpoint').read_text() == 'iter_1.pth'
    assert sorted(os.listdir(tmp_path)) == ['iter_1.pth', 'last_checkpoint']


class ToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        return dict(loss=out.sum()) if mode == 'loss' else out


def toy_runner(work_dir, name, hook_type, max_iters=3, **runner_kwargs):
    return Runner(
        model=ToyModel(),
        work_dir=str(work_dir),
        experiment_name=name,
        default_scope='mmdet',
        train_dataloader=dict(
            dataset=[dict(inputs=torch.ones(2))] * 8,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='pseudo_collate'),
            batch_size=2,
            num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=100),
            checkpoint=dict(
                type=hook_type, interval=1, by_epoch=False, max_keep_ckpts=1)),
        **runner_kwargs)


@pytest.mark.parametrize(
    'hook_type, survives',
    [
        ('AtomicCheckpointHook', True),
        ('CheckpointHook', False),  # mmengine's: deletes before it writes
    ])
@pytest.mark.slow
def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch,
                                                      hook_type, survives):

    def failing(put):

        def failing_put(self, obj, filepath):
            if osp.basename(filepath) == 'iter_3.pth':
                raise OSError(28, 'No space left on device')
            return put(self, obj, filepath)

        return failing_put

    for backend in (LocalBackend, AtomicLocalBackend):
        monkeypatch.setattr(backend, 'put', failing(backend.put))
    runner = toy_runner(tmp_path, f'fail_{hook_type}', hook_type)
    with pytest.raises(OSError, match='No space left on device'):
        runner.train()
    latest = (tmp_path / 'last_checkpoint').read_text()
    assert latest == str(tmp_path / 'iter_2.pth')
    assert osp.isfile(latest) is survives
    assert not glob.glob(str(tmp_path / '*.tmp')) and \
        not glob.glob(str(tmp_path / '.*.tmp'))
    if survives:
        checkpoint = torch.load(latest)  # torch's weights_only default
        assert checkpoint['meta']['iter'] == 2
        assert checkpoint['message_hub']['runtime_info']['keep_ckpt_ids'] == [
            2
        ]


@pytest.mark.slow
def test_outdated_checkpoints_go_after_the_new_one_is_saved(tmp_path):
    runner = toy_runner(tmp_path, 'order', 'AtomicCheckpointHook')
    # a leftover of a run killed while writing a checkpoint
    (tmp_path / 'iter_9.pth.incomplete-abc123.tmp').write_bytes(b'half')
    # (named so before)
    (tmp_path / '.iter_8.pth.abc123.tmp').write_bytes(b'half')
    (tmp_path / 'notes.tmp').write_text('not ours')
    runner.train()
    files = sorted(f.name for f in tmp_path.iterdir()
                   if f.name.endswith(('.pth', '.tmp', '_checkpoint')))
    assert files == ['iter_3.pth', 'last_checkpoint', 'notes.tmp']
    assert (tmp_path / 'last_checkpoint').read_text() == \
        str(tmp_path / 'iter_3.pth')
    # and it resumes, under torch's weights_only default
    resumed = toy_runner(
        tmp_path,
        'order_resumed',
        'AtomicCheckpointHook',
        max_iters=4,
        resume=True)
    resumed.train()
    assert resumed.iter == 4
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith('.pth')) \
        == ['iter_4.pth']


@pytest.mark.slow
def test_removal_waits_for_the_new_checkpoint_and_its_pointer(
        tmp_path, monkeypatch):
    """What each removal and each save sees, with mmengine's saving code
    as installed: the order is checked, not assumed (the hook overrides no
    private method of mmengine's CheckpointHook)."""
    assert not any(
        name.startswith('_save') for name in vars(AtomicCheckpointHook))
    seen = []
    last = tmp_path / 'last_checkpoint'
    remove = LocalBackend.remove

    def recording_remove(self, filepath):
        seen.append(('remove', osp.basename(filepath),
                     osp.basename(last.read_text()),
                     sorted(f for f in os.listdir(tmp_path)
                            if f.endswith('.pth'))))
        return remove(self, filepath)

    monkeypatch.setattr(LocalBackend, 'remove', recording_remove)
    toy_runner(tmp_path, 'removal_order', 'AtomicCheckpointHook').train()
    # iter_1 goes once iter_2 is written and named, iter_2 after iter_3
    assert seen == [
        ('remove', 'iter_1.pth', 'iter_2.pth', ['iter_1.pth', 'iter_2.pth']),
        ('remove', 'iter_2.pth', 'iter_3.pth', ['iter_2.pth', 'iter_3.pth']),
    ]


@pytest.mark.parametrize('content', ['', 'iter_9', 'missing.pth'])
@pytest.mark.slow
def test_a_truncated_last_checkpoint_is_repaired_before_resuming(
        tmp_path, content):
    toy_runner(tmp_path, 'repair', 'AtomicCheckpointHook').train()
    (tmp_path / 'iter_1.pth').write_bytes(b'')  # older: not chosen
    # a kill while mmengine rewrote last_checkpoint in place
    (tmp_path / 'last_checkpoint').write_text(
        str(tmp_path / content) if content else '')
    resumed = toy_runner(
        tmp_path, f'repair_{content}', 'AtomicCheckpointHook', max_iters=4,
        resume=True)
    resumed.train()
    assert resumed.iter == 4  # resumed from iter 3, not from scratch
    assert (tmp_path / 'last_checkpoint').read_text() == \
        str(tmp_path / 'iter_4.pth')
    # nothing to resume from: the dangling pointer goes, training starts
    for f in tmp_path.glob('iter_*.pth'):
        f.unlink()
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_4.pth'))
    fresh = toy_runner(
        tmp_path, f'fresh_{content}', 'AtomicCheckpointHook', max_iters=1,
        resume=True)
    fresh.train()
    assert fresh.iter == 1


def build(name, seed=0, **model):
    cfg = get_config(name)
    cfg.model.update(model)
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()  # mmdet's level_embed starts uninitialised
    return model


@pytest.fixture(scope='module')
def models():
    return dict(
        dino=build('calidet/dino_tiny_coco-mini.py'),
        calidino=build('calidet/calidet_dino_tiny_coco-mini.py'))


def named_keys(text, state):
    """The keys of ``state`` that ``text`` names, in their order there."""
    found = re.findall(r'[\w.]+', text)
    return [k for k in found if k in state]


def shapes_named(text):
    """``{key: (checkpoint shape, model shape)}`` a message lists."""

    def shape(text):
        return tuple(int(n) for n in text.split(',') if n.strip())

    return {
        key: (shape(a), shape(b))
        for key, a, b in re.findall(
            r'([\w.]+): checkpoint \(([\d, ]+)\), model \(([\d, ]+)\)', text)
    }


def test_dino_checkpoint_into_calidino(models):
    dino_state = models['dino'].state_dict()
    cali_state = models['calidino'].state_dict()
    new_keys = set(cali_state) - set(dino_state)
    assert 'prior' in new_keys
    assert all(k == 'prior' or k.startswith('bbox_head.califormer.')
               for k in new_keys)
    # reported, not refused: the paper's recipe fine-tunes a DINO
    message, = check_checkpoint(models['calidino'], dino_state)
    assert 'CaliDINO' in message and 'no CaliDet calibration' in message
    # it names some of the tensors that keep their initial values, and
    # how many there are
    named = named_keys(message, cali_state)
    assert named and set(named) <= new_keys and named[0] == 'prior'
    assert f'({len(new_keys)} in all)' in message
    # refused where an uncalibrated model must not be used (tools/test.py)
    with pytest.raises(CheckpointMismatchError) as info:
        check_checkpoint(
            models['calidino'], dino_state, allow_uncalibrated=False)
    assert named_keys(str(info.value), cali_state) == named
    assert 'untrained CaliFormer' in str(info.value)


def test_calidino_checkpoint_into_dino(models):
    cali_state = models['calidino'].state_dict()
    dropped = set(cali_state) - set(models['dino'].state_dict())
    message, = check_checkpoint(models['dino'], cali_state)
    assert 'DINO' in message and 'dropped' in message
    named = named_keys(message, cali_state)
    assert named and set(named) <= dropped
    # everything else loads
    result = models['dino'].load_state_dict(cali_state, strict=False)
    assert not result.missing_keys
    assert set(result.unexpected_keys) == dropped


def test_checkpoint_of_another_class_count(models):
    small = build(
        'calidet/calidet_dino_tiny_coco-mini.py',
        prior=None,
        bbox_head=dict(num_classes=20),
        data_preprocessor=dict(batch_augments=None))
    big_state = models['calidino'].state_dict()
    small_state = small.state_dict()
    differ = {
        k: (tuple(v.shape), tuple(small_state[k].shape))
        for k, v in big_state.items()
        if k in small_state and v.shape != small_state[k].shape
    }
    assert differ['prior'] == ((80, 80), (20, 20))
    with pytest.raises(CheckpointMismatchError) as info:
        check_checkpoint(small, big_state)
    text = str(info.value)
    assert re.search(r'\b80 classes\b.*\b20\b', text), text
    # the tensors it lists are those whose shapes differ, with their shapes
    listed = shapes_named(text)
    assert listed and listed.items() <= differ.items()
    assert 'prior' in listed and 'allow_shape_mismatch=True' in text
    # allowed: reported, and these tensors keep their initialisation
    message, = check_checkpoint(small, big_state, allow_shape_mismatch=True)
    assert shapes_named(message) == listed


@pytest.mark.parametrize('name,head', [
    ('calidet/rtmdet_tiny_coco-mini.py', dict(bbox_head=dict(num_classes=20))),
    ('calidet/calidet_faster-rcnn_tiny_coco-mini.py',
     dict(
         prior=None,
         data_preprocessor=dict(batch_augments=None),
         roi_head=dict(bbox_head=dict(num_classes=20)))),
])
def test_another_class_count_is_named_for_one_and_two_stage_heads(name, head):
    """The class counts come from a one-stage head's first level
    (``rtm_cls.0``) or a two-stage box head's ``fc_cls`` (K + 1)."""
    big_state = build(name).state_dict()
    with pytest.raises(CheckpointMismatchError,
                       match=r'trained for 80 classes, the model has 20'):
        check_checkpoint(build(name, **head), big_state)


def test_compat_hook_is_strict_when_resuming(models):
    dino_state = dict(state_dict=models['dino'].state_dict())
    logger = MMLogger.get_instance('compat_hook_test')
    runner = SimpleNamespace(
        model=models['calidino'], logger=logger, _resume=False)
    CheckpointCompatHook().after_load_checkpoint(runner, dino_state)
    runner._resume = True
    with pytest.raises(CheckpointMismatchError, match='no CaliDet calib'):
        CheckpointCompatHook().after_load_checkpoint(runner, dino_state)
    # a checkpoint with DDP's "module." prefix is compared without it
    wrapped = dict(state_dict={
        f'module.{k}': v
        for k, v in models['calidino'].state_dict().items()
    })
    assert check_checkpoint(models['calidino'], wrapped['state_dict']) == []


def load_tool(name):
    spec = importlib.util.spec_from_file_location(
        f'tool_{name}', osp.join(PROJECT_ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_test_tool_refuses_a_checkpoint_that_does_not_fit(
        tmp_path, models, monkeypatch):
    path = str(tmp_path / 'dino.pth')
    save_checkpoint(
        dict(state_dict=copy.deepcopy(models['dino'].state_dict())), path)
    out = tmp_path / 'results.pkl'
    out.write_bytes(b'earlier results')
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    monkeypatch.setattr(sys, 'argv', [
        'tools/test.py', 'configs/calidet/calidet_dino_tiny_coco-mini.py',
        path, '--work-dir',
        str(tmp_path / 'work'), '--out',
        str(out), '--cfg-options', 'test_dataloader.dataset.indices=1'
    ])
    with pytest.raises(CheckpointMismatchError) as info:
        load_tool('test').main()
    assert str(info.value).startswith(
        f"checkpoint {path} has no CaliDet calibration (a plain detector's): "
        "CaliDINO's CaliFormer and prior")
    assert out.read_bytes() == b'earlier results'
    assert sorted(os.listdir(tmp_path)) == ['dino.pth', 'results.pkl', 'work']


@pytest.mark.parametrize('content', [b'', b'PK\x03\x04 half a zip', None])
@pytest.mark.slow
def test_test_tool_says_in_one_line_that_a_checkpoint_is_unreadable(
        tmp_path, content):
    path = str(tmp_path / 'bad.pth')
    if content is None:
        os.mkfifo(path)  # would block torch.load
    else:
        with open(path, 'wb') as f:
            f.write(content)
    res = run_tool_in_process(
        'tools/test.py', 'configs/calidet/calidet_dino_tiny_coco-mini.py',
        path, '--work-dir', str(tmp_path / 'work'))
    assert res.returncode == 1
    assert 'Traceback' not in res.stderr
    expected = {
        b'': f'checkpoint is empty: {path}',
        None: f'checkpoint is not a regular file: {path}',
    }.get(content, f'checkpoint {path} is truncated, corrupt or not a '
          'checkpoint (RuntimeError: PytorchStreamReader failed reading zip '
          'archive: not a ZIP archive)')
    assert res.stderr.strip().splitlines()[-1] == f'test.py: error: {expected}'
