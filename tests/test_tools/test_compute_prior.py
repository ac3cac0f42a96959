# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/analysis_tools/compute_prior.py as a user runs it."""
import json
import os
import os.path as osp
import tarfile

import numpy as np
import pytest

from mmcalidet.priors import load_prior

pytestmark = pytest.mark.slow

TOOL = 'tools/analysis_tools/compute_prior.py'


def test_coco_json(tmp_path, datasets_dir, run_tool):
    ann = osp.join(datasets_dir, 'coco-mini', 'reference',
                   'instances_val2017_coco-mini.json')
    out = str(tmp_path / 'p.json')
    res = run_tool(TOOL, ann, '--out', out)
    assert res.returncode == 0, res.stderr
    prior, meta = load_prior(out, return_meta=True)
    with open(ann) as f:
        data = json.load(f)
    assert meta['num_images'] == len(data['images'])
    # mmdet's class order: the categories sorted by id
    cats = sorted(data['categories'], key=lambda c: c['id'])
    assert meta['classes'] == [c['name'] for c in cats]
    assert meta['classes'][0] == 'person' and len(meta['classes']) == 80
    # the definition, counted here: per image the set of its classes (crowd
    # boxes left out), E[i, j] = #images with i and j / #images with j,
    # 0.5 in the column of a class no image has, 1 on the diagonal
    index = {c['id']: k for k, c in enumerate(cats)}
    present = np.zeros((len(data['images']), len(cats)), bool)
    row = {img['id']: r for r, img in enumerate(data['images'])}
    for a in data['annotations']:
        if not a.get('iscrowd', 0):
            present[row[a['image_id']], index[a['category_id']]] = True
    both = present.T.astype(float) @ present.astype(float)
    count = present.sum(0)
    expected = np.full(both.shape, 0.5)
    seen = count > 0
    expected[:, seen] = both[:, seen] / count[seen]
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(prior, expected, rtol=0, atol=1e-12)
    assert meta['images_per_class'] == {
        c['name']: int(n)
        for c, n in zip(cats, count)
    }


def test_yolo_dir_and_tarball_agree(tmp_path, datasets_dir, run_tool):
    labels = osp.join(datasets_dir, 'coco-mini', 'labels', 'train2017')
    classes = osp.join(datasets_dir, 'coco2017-labels', 'classes.json')
    tar_path = str(tmp_path / 'labels.tar.gz')
    with tarfile.open(tar_path, 'w:gz') as tar:
        tar.add(labels, arcname='labels/train2017')
    outs = []
    for src in (labels, tar_path):
        out = str(tmp_path / f'{len(outs)}.json')
        res = run_tool(TOOL, src, '--classes', classes, '--out', out)
        assert res.returncode == 0, res.stderr
        assert 'wrote' in res.stdout
        outs.append(load_prior(out))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bad_input_one_line_and_nothing_lost(tmp_path, run_tool):
    labels = tmp_path / 'labels'
    labels.mkdir()
    (labels / '1.txt').write_text('0 0.5 0.5 0.1\n')
    (tmp_path / 'classes.txt').write_text('a\nb\n')
    out = tmp_path / 'out.json'
    out.write_text('precious')
    res = run_tool(TOOL, str(labels), '--classes',
                   str(tmp_path / 'classes.txt'), '--out', str(out),
                   '--no-progress')
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and '1.txt, line 1: 4 fields' in lines[0]
    assert out.read_text() == 'precious'
    assert sorted(
        os.listdir(tmp_path)) == ['classes.txt', 'labels', 'out.json']
    # YOLO without class names
    res = run_tool(TOOL, str(labels), '--out', str(out))
    assert res.returncode == 1 and '--classes' in res.stderr
    # an empty annotation file
    (tmp_path / 'empty.json').write_text('')
    res = run_tool(TOOL, str(tmp_path / 'empty.json'), '--out', str(out))
    assert res.returncode == 1 and 'empty' in res.stderr
    assert out.read_text() == 'precious'
