# Copyright (c) mmcalidet contributors. All rights reserved.
"""Every tool tidies up: what a failed or killed run of ``make_data.py``,
``cache_decoder_outputs.py`` or ``fit_site_prior.py`` wrote is gone once
the next run starts (or the failed run ends), and a bad site file is one
line naming it, before anything is written."""
import errno
import os
import os.path as osp
import runpy
import socket

import pytest
import torch
from mmdet.structures import DetDataSample

from mmcalidet.decoder_cache import DecoderCacheWriter, train_fingerprint
from testing import PROJECT_ROOT, data_root

#: beyond any Linux pid (pid_max <= 2**22): a dead process
DEAD_PID = 2**22 + 1
CONFIG = osp.join(PROJECT_ROOT, 'configs', 'calidet',
                  'calidet_dino_tiny_coco-mini.py')
SITE_IMGS = osp.join(data_root(), 'coco-mini', 'images', 'val2017')
SITE_ANN = osp.join(data_root(), 'coco-mini', 'reference',
                    'instances_val2017_coco-mini.json')


def tool(path):
    """A tool's module namespace (loaded without running it)."""
    return runpy.run_path(osp.join(PROJECT_ROOT, path), run_name='tool')


def tree(folder):
    """Every path under ``folder`` (relative), and each file's content."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            found[osp.relpath(osp.join(root, name), folder)] = None
        for name in files:
            path = osp.join(root, name)
            with open(path, 'rb') as f:
                found[osp.relpath(path, folder)] = f.read()
    return found


# --- 4. make_data.py leaves no OUT.partial ------------------------------

TINY = [
    '--num-train', '2', '--num-val-per-site', '1', '--img-size', '32',
    '--digit-size', '8', '12', '--no-progress'
]


@pytest.fixture
def make_data():
    return tool('projects/context_shift/tools/make_data.py')['main']


def test_a_failed_make_data_leaves_no_partial_folder(tmp_path, monkeypatch,
                                                     make_data):
    from projects.context_shift.context_shift import (data_writer,
                                                      simulated_sites)
    out = str(tmp_path / 'data')
    add_image = data_writer.BenchmarkWriter.add_image
    added = []

    def disk_full(self, *args, **kwargs):
        if added:  # the second image finds the disk full
            raise OSError(errno.ENOSPC, 'No space left on device')
        added.append(1)
        add_image(self, *args, **kwargs)

    monkeypatch.setattr(data_writer.BenchmarkWriter, 'add_image', disk_full)
    with pytest.raises(OSError) as exc:
        make_data(['--out', out] + TINY)
    assert f'no space left on the device for {out}' in str(exc.value)
    assert '\n' not in str(exc.value)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()

    # the validation sites fail after the data is drawn: nothing looks
    # finished (no meta.json of deployment sites), nothing is left

    def failed(*args, **kwargs):
        raise RuntimeError('killed')

    monkeypatch.setattr(simulated_sites, '_write_validation_sites', failed)
    with pytest.raises(RuntimeError, match='killed'):
        make_data(['--out', out, '--validation-sites'] + TINY)
    assert os.listdir(tmp_path) == []


def test_the_next_make_data_removes_a_killed_runs_partial_folder(
        tmp_path, make_data):
    out = str(tmp_path / 'data')
    os.makedirs(osp.join(out + '.partial', 'images'))
    make_data(['--out', out] + TINY)
    assert sorted(os.listdir(tmp_path)) == ['data']
    assert osp.isfile(osp.join(out, 'meta.json'))
    # a call that refuses to go on (the folder exists) removes it too
    os.makedirs(osp.join(out + '.partial', 'images'))
    with pytest.raises(ValueError, match='exists'):
        make_data(['--out', out] + TINY)
    assert sorted(os.listdir(tmp_path)) == ['data']


# --- 5. cache_decoder_outputs.py removes the partial folders of dead runs


def test_an_up_to_date_cache_call_removes_dead_partial_folders(
        tmp_path, capsys):
    config = tmp_path / 'detector.py'
    config.write_text("model = dict(type='M')\n"
                      'train_dataloader = dict(dataset=dict(ann_file=1))\n')
    checkpoint = tmp_path / 'detector.pth'
    checkpoint.write_bytes(b'weights')
    out = str(tmp_path / 'cache')
    fingerprint = train_fingerprint(str(config), str(checkpoint))
    writer = DecoderCacheWriter(out, fingerprint=fingerprint)
    sample = DetDataSample(metainfo=dict(img_id=0, img_shape=(8, 8)))
    writer.add(
        torch.zeros(2, 1, 3, 4), torch.full((2, 1, 3, 4), 0.5), [sample], 0)
    writer.commit()
    host = socket.gethostname()
    dead = tmp_path / f'.cache.partial-{DEAD_PID}-0123abcd@{host}'
    alive = tmp_path / f'.cache.partial-{os.getpid()}-0123abcd@{host}'
    for folder in (dead, alive):
        folder.mkdir()
        (folder / 'hidden.npy').write_bytes(b'half')
    main = tool('tools/analysis_tools/cache_decoder_outputs.py')['main']
    assert main([str(config), str(checkpoint), '--out', out]) == 0
    printed = capsys.readouterr().out
    assert 'is up to date' in printed
    # a killed --force run's folder is gone (and named); a running one's
    # stays
    assert not dead.exists() and alive.exists()
    assert f'removed the stale decoder cache folder {dead}' in printed


# --- 6. fit_site_prior.py: the tools' output folder; a failure writes
# nothing --------------------------------------------------------------


@pytest.fixture
def fit_site_prior():
    return tool('tools/analysis_tools/fit_site_prior.py')


def test_fit_site_prior_writes_where_the_other_tools_do(fit_site_prior):
    args = fit_site_prior['parse_args']([CONFIG, 'x.pth', '--out', 'p.json'])
    # tools/train.py's and tools/test.py's ./work_dirs/<config file stem>
    assert args.out_dir == osp.join('./work_dirs',
                                    'calidet_dino_tiny_coco-mini')
    args = fit_site_prior['parse_args'](
        [CONFIG, 'x.pth', '--out', 'p.json', '--out-dir', 'mine'])
    assert args.out_dir == 'mine'


def test_a_failed_fit_writes_nothing(tmp_path, monkeypatch, fit_site_prior):
    monkeypatch.chdir(tmp_path)
    missing = str(tmp_path / 'missing.pth')
    argv = [
        CONFIG, missing, '--site-ann', SITE_ANN, '--site-img-dir', SITE_IMGS,
        '--out', 'site.json', '--device', 'cpu', '--no-progress'
    ]
    with pytest.raises(Exception, match='missing.pth'):
        fit_site_prior['main'](argv)
    # no ./work_dirs/<stem>/eval.log, no prior: nothing at all
    assert os.listdir(tmp_path) == []
    # an output folder that was there keeps what it held, its log as it was
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'eval.log').write_text('an earlier run\n')
    with pytest.raises(Exception, match='missing.pth'):
        fit_site_prior['main'](argv + ['--out-dir', 'out'])
    assert tree(tmp_path) == {
        'out': None,
        osp.join('out', 'eval.log'): b'an earlier run\n'
    }


# --- 8. fit_site_prior.py: a bad site file is one line naming it --------


@pytest.mark.parametrize('content,problem', [
    ('{"images": [{"id": 1, "file_name": "a.jpg"', 'is not valid JSON'),
    ('{"images": [], "annotations": [], "categories": []}', 'holds no images'),
    ('[1, 2]', 'is not a COCO annotation file'),
])
def test_a_bad_site_annotation_file_is_one_line(tmp_path, monkeypatch,
                                                fit_site_prior, content,
                                                problem):
    monkeypatch.chdir(tmp_path)
    site = tmp_path / 'site.json'
    site.write_text(content)
    images = tmp_path / 'images'
    images.mkdir()
    with pytest.raises(ValueError) as exc:
        fit_site_prior['main']([
            CONFIG, 'x.pth', '--site-ann',
            str(site), '--site-img-dir',
            str(images), '--out', 'p.json'
        ])
    message = str(exc.value)
    assert '\n' not in message
    assert str(site) in message and problem in message
    # refused before anything was written
    assert sorted(os.listdir(tmp_path)) == ['images', 'site.json']
