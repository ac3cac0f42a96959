# Copyright (c) mmcalidet contributors. All rights reserved.
"""The decoder-cache format on synthetic outputs: one reader over memory
and folders, validation on open, atomic and private writes."""
import errno
import gc
import json
import os
import os.path as osp
import socket

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from mmcalidet.decoder_cache import (CacheError, DecoderCache,
                                     DecoderCacheWriter, check_cache)
from mmcalidet.decoder_cache import npy as npy_module
from mmcalidet.decoder_cache import (open_or_make, remove_stale_folders,
                                     stale_reasons)
from testing import captured_log, damage_cache_file

L, B, Q, D = 3, 2, 5, 8
FP = dict(checkpoint=dict(sha1='a'), layers='all')
#: beyond any Linux pid (pid_max <= 2**22): a dead process
DEAD_PID = 2**22 + 1

#: a damage per file, as a killed or overwritten run leaves it
CORRUPTIONS = {
    'truncate hidden': ('hidden.npy', 'truncate'),
    'truncate boxes': ('boxes.npy', 'truncate'),
    'truncate gt_labels': ('gt_labels.npy', 'truncate'),
    'delete hidden': ('hidden.npy', 'delete'),
    'delete gt_offsets': ('gt_offsets.npy', 'delete'),
    'garble metainfo': ('metainfo.json', 'garble'),
    'garble meta': ('meta.json', 'garble'),
}


def samples(num, start=0):
    out = []
    for k in range(num):
        ds = DetDataSample(
            metainfo=dict(
                img_id=start + k,
                img_path=f'im{start + k}.jpg',
                img_shape=(32, 40),
                ori_shape=(64, 80),
                scale_factor=(0.5, 0.5)))
        gt = InstanceData()
        gt.bboxes = torch.arange(4 * (k + 1), dtype=torch.float32).view(-1, 4)
        gt.labels = torch.arange(k + 1) + start
        ds.gt_instances = gt
        out.append(ds)
    return out


def outputs(batches=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(L, B, Q, D, generator=g),
             torch.rand(L, B, Q, 4, generator=g), samples(B, b * B), b)
            for b in range(batches)]


def write(target=None, fingerprint=FP, seed=0, **kwargs):
    writer = DecoderCacheWriter(target, fingerprint=fingerprint, **kwargs)
    for batch in outputs(seed=seed):
        writer.add(*batch)
    return writer.commit()


def private_entries(parent):
    return sorted(e for e in os.listdir(parent) if e.startswith('.'))


@pytest.mark.parametrize('layers', ['all', 'last'])
def test_folder_and_memory_caches_read_alike(tmp_path, layers):
    target = str(tmp_path / 'cache')
    disk = write(target, layers=layers, dtype='float16')
    memory = write(layers=layers, dtype='float16')
    again = DecoderCache.open(target)
    assert disk.folder == again.folder == target and memory.folder is None
    assert sorted(os.listdir(target)) == [
        'batch_ids.npy', 'boxes.npy', 'gt_bboxes.npy', 'gt_labels.npy',
        'gt_offsets.npy', 'hidden.npy', 'meta.json', 'metainfo.json'
    ]
    assert private_entries(str(tmp_path)) == []
    hidden = torch.cat([h for h, _, _, _ in outputs()], 1).transpose(0, 1)
    boxes = torch.cat([b for _, b, _, _ in outputs()], 1).transpose(0, 1)
    if layers == 'last':
        hidden, boxes = hidden[:, -1:], boxes[:, -1:]
    for cache in (disk, memory, again):
        assert len(cache) == 2 * B
        assert cache.num_layers == (L if layers == 'all' else 1)
        assert cache.layer_index == L - 1
        assert cache.fingerprint == FP
        assert cache.batch_ids == [0, 0, 1, 1]
        assert cache.img_ids() == [0, 1, 2, 3]
        assert [lab.tolist() for lab in cache.gt_label_lists()] == [[0],
                                                                    [0,
                                                                     1], [2],
                                                                    [2, 3]]
        h, b, s = cache.get([3, 1])
        torch.testing.assert_close(h, hidden[[3, 1], -1].half().float())
        torch.testing.assert_close(b, boxes[[3, 1], -1])
        assert h.dtype == b.dtype == torch.float32
        assert s[0].img_shape == (32, 40) and s[0].scale_factor == (0.5, 0.5)
        assert s[1].img_path == 'im1.jpg'
        assert torch.equal(s[1].gt_instances.bboxes,
                           samples(2)[1].gt_instances.bboxes)
        h_all, b_all = cache.layers_of(2)
        torch.testing.assert_close(h_all, hidden[2].half().float())
        torch.testing.assert_close(b_all, boxes[2])


@pytest.mark.parametrize('damage_kind', list(CORRUPTIONS))
def test_a_torn_file_is_named_on_open_and_remade_by_a_builder(
        tmp_path, damage_kind):
    target = str(tmp_path / 'cache')
    write(target)
    path = damage_cache_file(target, *CORRUPTIONS[damage_kind])
    # a reader without a source: an error naming the file
    with pytest.raises(ValueError, match=path) as info:
        DecoderCache.open(target)
    assert isinstance(info.value, CacheError) and info.value.path == path
    reasons = stale_reasons(target, FP)
    assert len(reasons) == 1 and reasons[0].startswith(osp.basename(path))
    # a builder: made again, saying which file
    with captured_log() as lines:
        cache, made = open_or_make(target, FP, lambda: write(target))
    assert made and len(cache) == 2 * B
    assert [line for line in lines if 'making it again' in line
            ] == [f'decoder cache {target}: {reasons[0]}; making it again']
    check_cache(target)
    assert stale_reasons(target, FP) == []
    assert private_entries(str(tmp_path)) == []


def test_meta_records_every_array(tmp_path):
    target = str(tmp_path / 'cache')
    write(target, dtype='float16')
    with open(osp.join(target, 'meta.json')) as f:
        meta = json.load(f)
    arrays = meta['arrays']
    assert arrays['hidden'] == dict(shape=[4, L, Q, D], dtype='float16')
    assert arrays['boxes'] == dict(shape=[4, L, Q, 4], dtype='float32')
    assert arrays['gt_labels']['shape'] == [6]
    assert arrays['gt_offsets']['shape'] == [5]
    assert arrays['batch_ids']['shape'] == [4]
    assert set(meta['files']['metainfo.json']) == {'size', 'sha1'}
    # an array of another shape than recorded, with a consistent header
    np.save(osp.join(target, 'batch_ids.npy'), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match='batch_ids.npy: shape'):
        DecoderCache.open(target)


def test_same_fingerprint_is_kept_other_is_replaced_not_overwritten(tmp_path):
    target = str(tmp_path / 'cache')
    first = write(target)
    old_hidden = np.array(first.hidden)
    inode = os.stat(osp.join(target, 'hidden.npy')).st_ino
    # a run that started before the first one finished: the complete
    # cache of the same fingerprint stays, its own partial folder goes
    writer = DecoderCacheWriter(target, fingerprint=FP)
    for batch in outputs(seed=1):
        writer.add(*batch)
    same = writer.commit()
    assert os.stat(osp.join(target, 'hidden.npy')).st_ino == inode
    np.testing.assert_array_equal(np.array(same.hidden), old_hidden)
    # another fingerprint replaces the folder by a rename: a reader of the
    # old one keeps reading the old arrays
    other = write(
        target, fingerprint=dict(FP, checkpoint=dict(sha1='b')), seed=1)
    assert other.fingerprint['checkpoint'] == dict(sha1='b')
    assert os.stat(osp.join(target, 'hidden.npy')).st_ino != inode
    np.testing.assert_array_equal(np.array(first.hidden), old_hidden)
    assert not np.array_equal(np.array(other.hidden), old_hidden)
    assert private_entries(str(tmp_path)) == []


def test_stale_private_folders_are_removed_at_the_next_build(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f'.cache.partial-{DEAD_PID}-0123abcd@{host}'
    dead_old = tmp_path / f'.other.old-{DEAD_PID}-89abcdef@{host}'
    live = tmp_path / f'.cache.partial-{os.getpid()}-00000000@{host}'
    elsewhere = tmp_path / f'.cache.partial-{DEAD_PID}-0123abcd@not-{host}'
    for folder in (dead, dead_old, live, elsewhere):
        folder.mkdir()
        (folder / 'hidden.npy').write_bytes(b'half')
    write(str(tmp_path / 'cache'))
    assert private_entries(str(tmp_path)) == sorted(
        [live.name, elsewhere.name])
    assert remove_stale_folders(str(tmp_path)) == []


def test_a_failed_build_leaves_no_folder(tmp_path):
    target = str(tmp_path / 'cache')
    writer = DecoderCacheWriter(target, fingerprint=FP)
    with pytest.raises(RuntimeError, match='boom'):
        with writer:
            writer.add(*outputs()[0])
            assert len(private_entries(str(tmp_path))) == 1
            raise RuntimeError('boom')
    assert os.listdir(tmp_path) == []


def test_a_full_disk_is_one_error_naming_the_folder(tmp_path, monkeypatch):
    target = str(tmp_path / 'cache')

    def full(self, rows):
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(npy_module.NpyAppender, 'append', full)
    writer = DecoderCacheWriter(target, fingerprint=FP)
    with pytest.raises(OSError) as info:
        writer.add(*outputs()[0])
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert target in message and 'no space left' in message
    assert '\n' not in message
    assert os.listdir(tmp_path) == []


def test_an_unkeyed_folder_cache_is_private_and_removed_after_use(tmp_path):
    cache = write(spill_dir=str(tmp_path), fingerprint=None)
    folder = cache.folder
    assert osp.dirname(folder) == str(tmp_path)
    assert osp.basename(folder).startswith('.decoder_cache.partial-')
    assert len(cache) == 2 * B
    del cache
    gc.collect()
    assert not osp.exists(folder)


def test_writer_errors():
    with pytest.raises(ValueError, match='layers'):
        DecoderCacheWriter(layers='first')
    with pytest.raises(ValueError, match='no images'):
        DecoderCacheWriter().commit()
    hidden, boxes, batch, _ = outputs()[0]
    with pytest.raises(ValueError, match=r'\(L, B, Q, d\)'):
        DecoderCacheWriter().add(hidden[0], boxes[0], batch, 0)


def test_a_stale_cache_behind_a_symlink_is_replaced_where_it_lies(tmp_path):
    """A cache folder reached through a symlink (e.g. to a larger disk) is
    remade in the folder the link points to: the link stays, and no
    renamed link or partial folder is left on either side."""
    disk = tmp_path / 'disk'
    disk.mkdir()
    real = disk / 'cache'
    write(str(real), seed=0)
    link = tmp_path / 'work' / 'cache'
    link.parent.mkdir()
    link.symlink_to(real, target_is_directory=True)
    other = write(
        str(link), fingerprint=dict(FP, checkpoint=dict(sha1='b')), seed=1)
    assert other.fingerprint['checkpoint'] == dict(sha1='b')
    assert link.is_symlink() and osp.realpath(link) == str(real)
    reopened = DecoderCache.open(str(real))
    assert reopened.fingerprint['checkpoint'] == dict(sha1='b')
    assert private_entries(str(disk)) == []
    assert sorted(os.listdir(link.parent)) == ['cache']
