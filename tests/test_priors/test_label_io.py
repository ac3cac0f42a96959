# Copyright (c) mmcalidet contributors. All rights reserved.
"""Label readers: COCO JSON, YOLO folders and streamed tarballs."""
import io
import json
import os
import os.path as osp
import signal
import tarfile
import tracemalloc
from contextlib import contextmanager

import numpy as np
import pytest

from mmcalidet.priors import batch_prior
from mmcalidet.priors.dataset_prior import prior_from_source, read_label_sets
from mmcalidet.priors.label_io import (read_class_names, read_coco_labels,
                                       read_yolo_dir)
from mmcalidet.priors.yolo_tarball import read_yolo_tarball
from mmcalidet.utils import file_io

NAMES = ['a', 'b', 'c', 'd']
FILES = {
    'x/001.txt': '0 0.5 0.5 0.1 0.1\n2 0.1 0.1 0.2 0.2\n2 0.3 0.3 .1 .1\n',
    'x/002.txt': '1 0.5 0.5 0.1 0.1\n\n2 0.5 0.5 0.1 0.1',  # no final \n
    'x/003.txt': '',
    'x/004.txt': '3 0.5 0.5 0.1 0.1\r\n0 0.5 0.5 0.1 0.1\r\n',
}
EXPECTED = [[0, 2, 2], [1, 2], [], [3, 0]]


def _write_dir(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _write_tar(path, files, long_names=False, fmt=tarfile.GNU_FORMAT):
    with tarfile.open(path, 'w:gz', format=fmt) as tar:
        info = tarfile.TarInfo('x')
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, text in files.items():
            if long_names:
                name = 'd' * 120 + '/' + name
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo('x/readme.md')
        info.size = 5
        tar.addfile(info, io.BytesIO(b'hello'))


def test_yolo_dir(tmp_path):
    _write_dir(tmp_path, FILES)
    (tmp_path / 'x' / 'classes.txt').write_text('a\nb\nc\nd\n')
    sets = read_yolo_dir(str(tmp_path), NAMES)
    assert [list(x) for x in sets.label_lists()] == EXPECTED
    np.testing.assert_array_equal(
        prior_from_source(str(tmp_path), NAMES, progress=False)[0],
        batch_prior(4, EXPECTED))


@pytest.mark.parametrize('long_names', [False, True])
@pytest.mark.parametrize('fmt', [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT,
                                 tarfile.USTAR_FORMAT])
def test_yolo_tarball_streamed(tmp_path, long_names, fmt, monkeypatch):
    if long_names and fmt == tarfile.USTAR_FORMAT:
        long_names = False  # ustar stores long names in its prefix field
    path = str(tmp_path / 'labels.tar.gz')
    _write_tar(path, FILES, long_names, fmt)
    # tiny chunks: members straddle chunk boundaries
    monkeypatch.setattr('mmcalidet.priors.yolo_tarball.TAR_CHUNK_BYTES', 37)
    sets = read_yolo_tarball(path, NAMES, keep_names=True)
    assert [list(x) for x in sets.label_lists()] == EXPECTED
    assert all(name.endswith('.txt') for name in sets.extra['files'])
    assert len(sets.extra['files']) == 4
    seen = []
    sets = read_label_sets(path, NAMES, progress=seen.append)
    assert sum(seen) == osp.getsize(path)


def test_yolo_tarball_equals_folder_on_real_labels(tmp_path, datasets_dir):
    labels = osp.join(datasets_dir, 'coco-mini', 'labels', 'val2017')
    classes = osp.join(datasets_dir, 'coco2017-labels', 'classes.json')
    tar_path = str(tmp_path / 'val.tar.gz')
    with tarfile.open(tar_path, 'w:gz') as tar:
        tar.add(labels, arcname='labels/val2017')
    by_dir = prior_from_source(labels, classes, progress=False)
    by_tar = prior_from_source(tar_path, classes, progress=False)
    np.testing.assert_array_equal(by_dir[0], by_tar[0])
    np.testing.assert_array_equal(by_dir[1], by_tar[1])
    assert by_dir[2].num_images == by_tar[2].num_images == 235


@pytest.mark.parametrize('text, message', [
    ('0 0.5 0.5 0.1\n', '4 fields'),
    ('0 0.5 0.5 0.1 0.1 0.3\n', '6 fields'),
    ('x 0.5 0.5 0.1 0.1\n', 'not a non-negative integer'),
    ('-1 0.5 0.5 0.1 0.1\n', 'not a non-negative integer'),
    ('1.0 0.5 0.5 0.1 0.1\n', 'not a non-negative integer'),
    ('7 0.5 0.5 0.1 0.1\n', 'out of range'),
])
def test_bad_yolo_lines(tmp_path, text, message):
    files = dict(FILES)
    files['x/002.txt'] = '1 0.5 0.5 0.1 0.1\n' + text
    _write_dir(tmp_path / 'dir', files)
    with pytest.raises(ValueError, match=message) as err:
        read_yolo_dir(str(tmp_path / 'dir'), NAMES)
    if 'range' not in message:
        assert '002.txt, line 2' in str(err.value)
    _write_tar(str(tmp_path / 't.tar.gz'), files)
    with pytest.raises(ValueError, match=message):
        read_yolo_tarball(str(tmp_path / 't.tar.gz'), NAMES)


@contextmanager
def deadline(seconds):
    """Fail instead of hanging (a FIFO read blocks until a writer comes)."""

    def fail(*args):
        raise TimeoutError(f'still running after {seconds} s')

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_yolo_dir_refuses_devices_fifos_and_huge_files(
        tmp_path, monkeypatch):
    _write_dir(tmp_path, FILES)
    zero = tmp_path / 'x' / '005.txt'
    os.symlink('/dev/zero', zero)
    with deadline(10), pytest.raises(ValueError) as info:
        read_yolo_dir(str(tmp_path), NAMES)
    assert str(info.value) == f'label file is not a regular file: {zero}'
    zero.unlink()
    os.mkfifo(zero)
    with deadline(10), pytest.raises(ValueError) as info:
        read_yolo_dir(str(tmp_path), NAMES)
    assert str(info.value) == f'label file is not a regular file: {zero}'
    zero.unlink()
    # the size is bounded (a small limit stands in for a huge file)
    limit = 'mmcalidet.priors.label_io.MAX_LABEL_FILE_BYTES'
    monkeypatch.setattr(limit, 40)
    with pytest.raises(ValueError) as info:
        read_yolo_dir(str(tmp_path), NAMES)
    path = tmp_path / 'x' / '001.txt'
    assert str(info.value) == (f'label file is too large (52 bytes > limit '
                               f'40): {path}')
    monkeypatch.setattr(limit, 60)
    assert read_yolo_dir(str(tmp_path), NAMES).num_images == 4


def test_read_small_file_checks_the_open_file(tmp_path, monkeypatch):
    """A file swapped for a FIFO after the check is refused, not read."""
    fifo = tmp_path / 'swapped.txt'
    os.mkfifo(fifo)
    monkeypatch.setattr(file_io, 'check_readable_file',
                        lambda path, *args: str(path))
    with deadline(10), pytest.raises(ValueError) as info:
        file_io.read_small_file(fifo, 100, 'label file', allow_empty=True)
    assert str(info.value) == f'label file is not a regular file: {fifo}'
    grown = tmp_path / 'grown.txt'
    grown.write_bytes(b'0 0.5 0.5 0.1 0.1\n' * 10)
    with pytest.raises(ValueError) as info:
        file_io.read_small_file(grown, 100, 'label file')
    assert str(info.value) == \
        f'label file is too large (more than 100 bytes): {grown}'


def _write_tar_with(path, files, extra, fmt=tarfile.GNU_FORMAT):
    """``files`` (name -> text), then ``extra`` (name -> bytes), then one
    more label file."""
    with tarfile.open(path, 'w:gz', format=fmt) as tar:
        for name, data in [*((n, t.encode()) for n, t in files.items()),
                           *extra.items(), ('x/last.txt', b'1 .5 .5 .1 .1\n')]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize('fmt', [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_yolo_tarball_memory_stays_bounded(tmp_path, fmt):
    """A large member that is not a label file (16 MiB of zeros, a 16 kB
    archive) is skipped without being buffered or inflated whole."""
    path = str(tmp_path / 'big.tar.gz')
    _write_tar_with(path, FILES, {'d' * 120 + '/big.bin': bytes(16 << 20)},
                    fmt)
    assert osp.getsize(path) < 100_000
    tracemalloc.start()
    try:
        sets = read_yolo_tarball(path, NAMES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [list(x) for x in sets.label_lists()] == EXPECTED + [[1]]
    assert peak < 6 << 20, peak


@pytest.mark.parametrize('fmt', [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_yolo_tarball_refuses_a_huge_label_file_from_its_header(
        tmp_path, monkeypatch, fmt):
    path = str(tmp_path / 'huge.tar.gz')
    name = 'd' * 120 + '/huge.txt'
    _write_tar_with(path, FILES, {name: b'0 .5 .5 .1 .1\n' * 400}, fmt)
    # a small limit stands in for a member of gigabytes
    monkeypatch.setattr('mmcalidet.priors.yolo_tarball.MAX_LABEL_FILE_BYTES',
                        1000)
    monkeypatch.setattr('mmcalidet.priors.yolo_tarball.TAR_CHUNK_BYTES', 512)
    with pytest.raises(ValueError) as info:
        read_yolo_tarball(path, NAMES)
    assert str(info.value) == (f'{path}:{name}: label file is too large '
                               '(5600 bytes > limit 1000)')
    monkeypatch.setattr('mmcalidet.priors.yolo_tarball.MAX_LABEL_FILE_BYTES',
                        6000)
    sets = read_yolo_tarball(path, NAMES)
    assert sets.num_images == 6 and sets.label_lists()[4].size == 400


def test_corrupt_and_truncated_tarballs(tmp_path):
    path = tmp_path / 'l.tar.gz'
    _write_tar(str(path), FILES)
    data = path.read_bytes()
    (tmp_path / 'trunc.tar.gz').write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match='truncated'):
        read_yolo_tarball(str(tmp_path / 'trunc.tar.gz'), NAMES)
    (tmp_path / 'garbage.tar.gz').write_bytes(b'not gzip at all' * 10)
    with pytest.raises(ValueError, match='corrupt gzip'):
        read_yolo_tarball(str(tmp_path / 'garbage.tar.gz'), NAMES)
    (tmp_path / 'empty.tar.gz').write_bytes(b'')
    with pytest.raises(ValueError, match='empty'):
        read_yolo_tarball(str(tmp_path / 'empty.tar.gz'), NAMES)


def _coco(tmp_path, anns, cats=None):
    data = dict(
        images=[dict(id=i, file_name=f'{i}.jpg') for i in (10, 20, 30)],
        annotations=anns,
        categories=cats or [dict(id=5, name='b'), dict(id=1, name='a')])
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(data))
    return str(path)


def test_coco_labels_crowd_ignored_and_id_order(tmp_path):
    path = _coco(tmp_path, [
        dict(id=1, image_id=20, category_id=5, iscrowd=0),
        dict(id=2, image_id=10, category_id=1, iscrowd=0),
        dict(id=3, image_id=20, category_id=1, iscrowd=1),  # crowd
        dict(id=4, image_id=10, category_id=5),
    ])
    sets = read_coco_labels(path)
    assert sets.classes == ['a', 'b']  # sorted by category id
    assert [sorted(x) for x in sets.label_lists()] == [[0, 1], [1], []]
    sets = read_coco_labels(path, classes=['b', 'a'])
    assert [sorted(x) for x in sets.label_lists()] == [[0, 1], [0], []]
    assert 'files' not in sets.extra


def test_coco_labels_keep_file_names(tmp_path):
    data = _coco_data()
    del data['images'][1]['file_name']  # named by its id
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(data))
    sets = read_coco_labels(str(path), keep_names=True)
    assert sets.extra['files'] == ['10.jpg', '20', '30.jpg']
    assert len(sets.label_lists()) == 3


@pytest.mark.parametrize('anns, message', [
    ([dict(id=1, image_id=99, category_id=1)], 'unknown image id 99'),
    ([dict(id=1, image_id=10, category_id=42)], 'unknown category id 42'),
])
def test_coco_bad_annotations(tmp_path, anns, message):
    with pytest.raises(ValueError, match=message):
        read_coco_labels(_coco(tmp_path, anns))


def _coco_data(**changes):
    data = dict(
        images=[dict(id=i, file_name=f'{i}.jpg') for i in (10, 20, 30)],
        annotations=[dict(id=1, image_id=10, category_id=1, iscrowd=0)],
        categories=[dict(id=5, name='b'), dict(id=1, name='a')])
    data.update(changes)
    return data


BAD_COCO = [
    (dict(images={'10': {}}), '"images" is a dict, not a list'),
    (dict(images=[10, 20]), 'images[0] is a int, not an object'),
    (dict(images=[dict(file_name='a.jpg')]), 'images[0] has no "id"'),
    (dict(images=[dict(id='10')]),
     'images[0] "id" must be an integer, got \'10\''),
    (dict(images=[dict(id=10), dict(id=20), dict(id=10)]),
     'duplicated image id 10 (images[0] and images[2])'),
    (dict(categories=[dict(id=1, name='a'), dict(id=1, name='b')]),
     'duplicated category id 1 (categories[0] and categories[1])'),
    (dict(categories=[dict(name='a')]), 'categories[0] has no "id"'),
    (dict(categories=[dict(id=1)]), 'categories[0] has no "name"'),
    (dict(categories=[dict(id=True, name='a')]),
     'categories[0] "id" must be an integer, got True'),
    (dict(categories={'1': 'a'}), '"categories" is a dict, not a list'),
    (dict(annotations=[dict(id=7, category_id=1)]),
     'annotations[0] (id 7) has no "image_id"'),
    (dict(annotations=[dict(id=7, image_id=10)]),
     'annotations[0] (id 7) has no "category_id"'),
    (dict(annotations=[dict(id=7, image_id=10, category_id=1.5)]),
     'annotations[0] (id 7) "category_id" must be an integer, got 1.5'),
    (dict(annotations=[dict(id=7, image_id=[10], category_id=1)]),
     'annotations[0] (id 7) "image_id" must be an integer, got [10]'),
    (dict(annotations=[dict(id=7, image_id=10, category_id=1,
                            iscrowd='no')]),
     'annotations[0] (id 7) "iscrowd" must be 0 or 1, got \'no\''),
    (dict(annotations=[None]), 'annotations[0] is a NoneType, not an object'),
    (dict(annotations='none'), '"annotations" is a str, not a list'),
]


@pytest.mark.parametrize('changes, message', BAD_COCO)
def test_coco_wrong_keys_types_and_duplicates(tmp_path, changes, message):
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(_coco_data(**changes)))
    with pytest.raises(ValueError) as info:
        read_coco_labels(str(path))
    assert str(info.value) == f'{path}: {message}'


def test_coco_bad_files(tmp_path):
    empty = tmp_path / 'empty.json'
    empty.write_text('')
    with pytest.raises(ValueError, match='empty'):
        read_coco_labels(str(empty))
    bad = tmp_path / 'bad.json'
    bad.write_text('{"images": [')
    with pytest.raises(ValueError, match='not valid JSON'):
        read_coco_labels(str(bad))
    other = tmp_path / 'other.json'
    other.write_text('{"foo": 1}')
    with pytest.raises(ValueError, match='no "images"'):
        read_coco_labels(str(other))
    with pytest.raises(ValueError, match='not a category'):
        read_coco_labels(_coco(tmp_path, []), classes=['a', 'zebra'])


def test_coco_json_equals_yolo_on_real_data(datasets_dir):
    """The official COCO file and the YOLO labels of the same images give
    the same prior."""
    ref = osp.join(datasets_dir, 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    classes = read_class_names(
        osp.join(datasets_dir, 'coco2017-labels', 'classes.json'))
    from_json = read_coco_labels(ref, classes)
    with open(ref) as f:
        stems = [osp.splitext(img['file_name'])[0]
                 for img in json.load(f)['images']]
    label_dir = osp.join(datasets_dir, 'coco-mini', 'labels', 'val2017')
    lists = []
    for stem in stems:
        path = osp.join(label_dir, stem + '.txt')
        lists.append([int(line.split()[0]) for line in open(path)]
                     if osp.exists(path) else [])
    np.testing.assert_array_equal(
        batch_prior(80, from_json.label_lists()), batch_prior(80, lists))


def test_class_files(tmp_path):
    (tmp_path / 'c.txt').write_text('a\nb\n\n')
    assert read_class_names(str(tmp_path / 'c.txt')) == ['a', 'b']
    (tmp_path / 'c.json').write_text(
        json.dumps([dict(index=1, name='b'), dict(index=0, name='a')]))
    assert read_class_names(str(tmp_path / 'c.json')) == ['a', 'b']
    (tmp_path / 'd.json').write_text('["a", "a"]')
    with pytest.raises(ValueError, match='duplicated'):
        read_class_names(str(tmp_path / 'd.json'))


def test_unknown_source(tmp_path):
    with pytest.raises(ValueError, match='not found'):
        read_label_sets(str(tmp_path / 'nothing.xml'))
    (tmp_path / 'f.xml').write_text('x')
    with pytest.raises(ValueError, match='unknown source type'):
        read_label_sets(str(tmp_path / 'f.xml'))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(ValueError, match='no YOLO label files'):
        read_label_sets(str(tmp_path / 'empty'), NAMES)
