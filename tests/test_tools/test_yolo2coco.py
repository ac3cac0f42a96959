# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/dataset_converters/yolo2coco.py against official COCO files."""
import json
import os
import os.path as osp
import shutil
import signal
from collections import defaultdict

import numpy as np
import pytest

TOOL = 'tools/dataset_converters/yolo2coco.py'


def _by_image(coco):
    anns = defaultdict(list)
    for ann in coco['annotations']:
        if not ann.get('iscrowd', 0):
            anns[ann['image_id']].append(ann)
    return anns


def _check_against_reference(ours, ref):
    ours_imgs = {img['id']: img for img in ours['images']}
    for img in ref['images']:
        mine = ours_imgs[img['id']]
        assert mine['file_name'] == img['file_name']
        assert (mine['width'], mine['height']) == (img['width'], img['height'])
    assert {c['id']: c['name'] for c in ours['categories']} == \
        {c['id']: c['name'] for c in ref['categories']}
    ours_anns, ref_anns = _by_image(ours), _by_image(ref)
    checked = 0
    for img in ref['images']:
        mine, theirs = ours_anns[img['id']], ref_anns[img['id']]
        assert sorted(a['category_id'] for a in mine) == \
            sorted(a['category_id'] for a in theirs), img['file_name']
        for ann in theirs:
            # the closest converted box of the same category
            cands = [a for a in mine if a['category_id'] == ann['category_id']]
            err = min(
                np.abs(np.subtract(a['bbox'], ann['bbox'])).max()
                for a in cands)
            assert err < 1.0, (img['file_name'], ann['bbox'])
            checked += 1
    assert checked > 100


@pytest.mark.parametrize('split, subset', [('val2017', 'tiny'),
                                           ('train2017', 'mini')])
@pytest.mark.slow
def test_images_folder_matches_reference(tmp_path, datasets_dir, run_tool,
                                         split, subset):
    mini = osp.join(datasets_dir, 'coco-mini')
    out = str(tmp_path / 'ann.json')
    res = run_tool(TOOL, osp.join(mini, 'labels', split), '--images',
                   osp.join(mini, 'images', split), '--classes',
                   osp.join(datasets_dir, 'coco2017-labels', 'classes.json'),
                   '--out', out)
    assert res.returncode == 0, res.stderr
    with open(out) as f:
        ours = json.load(f)
    assert len(ours['images']) == len(
        os.listdir(osp.join(mini, 'images', split)))
    with open(
            osp.join(mini, 'reference',
                     f'instances_{split}_coco-{subset}.json')) as f:
        ref = json.load(f)
    _check_against_reference(ours, ref)


@pytest.mark.slow
def test_sizes_json_matches_reference(tmp_path, datasets_dir, run_tool):
    mini = osp.join(datasets_dir, 'coco-mini')
    out = str(tmp_path / 'ann.json')
    res = run_tool(
        TOOL, osp.join(mini, 'labels', 'val2017'), '--sizes',
        osp.join(datasets_dir, 'coco2017-labels',
                 'val2017_image_sizes.json'), '--classes',
        osp.join(datasets_dir, 'coco2017-labels', 'classes.json'), '--out',
        out, '--allow-orphans')
    assert res.returncode == 0, res.stderr
    with open(out) as f:
        ours = json.load(f)
    # only the images of the label folder, not every val2017 image
    labels = sorted(os.listdir(osp.join(mini, 'labels', 'val2017')))
    assert sorted(img['file_name'] for img in ours['images']) == \
        [name.replace('.txt', '.jpg') for name in labels]
    assert len(ours['images']) == 235
    with open(osp.join(mini, 'reference',
                       'instances_val2017_coco-mini.json')) as f:
        ref = json.load(f)
    _check_against_reference(ours, ref)
    # --keep-unlabelled: every image of the sizes file
    res = run_tool(
        TOOL, osp.join(mini, 'labels', 'val2017'), '--sizes',
        osp.join(datasets_dir, 'coco2017-labels',
                 'val2017_image_sizes.json'), '--classes',
        osp.join(datasets_dir, 'coco2017-labels', 'classes.json'), '--out',
        out, '--keep-unlabelled')
    assert res.returncode == 0, res.stderr
    with open(out) as f:
        everything = json.load(f)
    assert len(everything['images']) == 5000
    assert everything['annotations'] == ours['annotations']


@pytest.mark.slow
def test_sizes_without_labelled_images(tmp_path, datasets_dir, run_tool):
    sizes = tmp_path / 'sizes.json'
    sizes.write_text(json.dumps({'000000999999.jpg': [640, 480]}))
    classes = osp.join(datasets_dir, 'coco2017-labels', 'classes.json')
    out = tmp_path / 'ann.json'
    res = run_tool(TOOL,
                   osp.join(datasets_dir, 'coco-mini', 'labels', 'val2017'),
                   '--sizes', str(sizes), '--classes', classes, '--out',
                   str(out), '--allow-orphans')
    assert res.returncode == 1
    assert 'no image of the sizes file has a label file' in res.stderr
    assert not out.exists()
    res = run_tool(TOOL, str(tmp_path), '--images', str(tmp_path),
                   '--classes', classes, '--out', str(out),
                   '--keep-unlabelled')
    assert res.returncode == 2 and '--keep-unlabelled needs --sizes' \
        in res.stderr


@pytest.mark.slow
def test_corrupt_image_and_bad_lines(tmp_path, datasets_dir, run_tool):
    mini = osp.join(datasets_dir, 'coco-mini')
    classes = osp.join(datasets_dir, 'coco2017-labels', 'classes.json')
    images = tmp_path / 'images'
    labels = tmp_path / 'labels'
    images.mkdir()
    labels.mkdir()
    src = sorted(os.listdir(osp.join(mini, 'images', 'val2017')))[:2]
    for name in src:
        shutil.copy(osp.join(mini, 'images', 'val2017', name), images)
        shutil.copy(
            osp.join(mini, 'labels', 'val2017', name.replace('.jpg', '.txt')),
            labels)
    out = tmp_path / 'ann.json'
    out.write_text('keep me')
    # a truncated JPEG
    data = (images / src[0]).read_bytes()
    (images / src[0]).write_bytes(data[:200])
    res = run_tool(TOOL, str(labels), '--images', str(images), '--classes',
                   classes, '--out', str(out))
    assert res.returncode == 1
    assert 'corrupt or unreadable image' in res.stderr
    assert src[0] in res.stderr
    assert out.read_text() == 'keep me'
    # a label line with the wrong number of fields
    (images / src[0]).write_bytes(data)
    (labels / src[1].replace('.jpg', '.txt')).write_text('3 0.1 0.2\n')
    res = run_tool(TOOL, str(labels), '--images', str(images), '--classes',
                   classes, '--out', str(out))
    assert res.returncode == 1 and '3 fields' in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert out.read_text() == 'keep me'


def test_label_files_that_are_not_regular_files(tmp_path, monkeypatch):
    """A label "file" that is a FIFO or a link to /dev/zero is refused at
    once (it would block, or fill the memory); the size is bounded."""
    from mmcalidet.datasets.yolo_to_coco import yolo_to_coco
    cats = [dict(id=1, name='a', supercategory='a')]
    sizes = {'1.jpg': [100, 50], '2.jpg': [100, 50]}
    (tmp_path / '1.txt').write_text('0 0.5 0.5 0.2 0.2\n')
    bad = tmp_path / '2.txt'

    def timeout(*args):
        raise TimeoutError('blocked on the FIFO')

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(10)  # fail instead of hanging on the FIFO
    try:
        for make in (lambda: os.symlink('/dev/zero', bad),
                     lambda: os.mkfifo(bad)):
            make()
            with pytest.raises(ValueError) as info:
                yolo_to_coco(str(tmp_path), sizes, cats)
            assert str(info.value) == \
                f'label file is not a regular file: {bad}'
            bad.unlink()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    bad.write_text('0 0.5 0.5 0.2 0.2\n' * 3)
    monkeypatch.setattr('mmcalidet.datasets.yolo_to_coco.'
                        'MAX_LABEL_FILE_BYTES', 40)
    with pytest.raises(ValueError) as info:
        yolo_to_coco(str(tmp_path), sizes, cats)
    assert str(info.value) == \
        f'label file is too large (54 bytes > limit 40): {bad}'
    (tmp_path / '2.txt').write_bytes(b'0 0.5 0.5 0.2 0.2 \xff\n')
    monkeypatch.undo()
    with pytest.raises(ValueError, match=f'label file {bad} is not UTF-8'):
        yolo_to_coco(str(tmp_path), sizes, cats)


@pytest.mark.parametrize('line, message', [
    ('0 nan 0.5 0.2 0.2', "cx is 'nan', not a finite number"),
    ('0 0.5 NaN 0.2 0.2', "cy is 'NaN', not a finite number"),
    ('0 0.5 0.5 inf 0.2', "w is 'inf', not a finite number"),
    ('0 0.5 0.5 0.2 -Infinity', "h is '-Infinity', not a finite number"),
    ('0 0.5 0.5 0.2 1e400', "h is '1e400', not a finite number"),
    ('0 0.5 0.5 -0.2 0.2', 'negative box size (w -0.2, h 0.2)'),
    ('0 0.5 0.5 0.2 -1e-3', 'negative box size (w 0.2, h -1e-3)'),
])
def test_non_finite_and_negative_boxes_are_refused(tmp_path, line, message):
    from mmcalidet.datasets.yolo_to_coco import parse_yolo_boxes
    path = tmp_path / '1.txt'
    path.write_text(f'0 0.5 0.5 0.2 0.2\n{line}\n')
    with pytest.raises(ValueError) as info:
        parse_yolo_boxes(str(path), 1)
    assert str(info.value) == f'{path}, line 2: {message}'
    path.write_text('0 0.5 0.5 0 0.2\n')  # an empty box is not an error
    assert parse_yolo_boxes(str(path), 1) == [[0, 0.5, 0.5, 0.0, 0.2]]
