# Copyright (c) mmcalidet contributors. All rights reserved.
"""tools/dataset_converters/o365_to_coco.py on a small Objects365-style
fixture."""
import json
import os.path as osp
import runpy

import pytest

from testing import PROJECT_ROOT

TOOL = 'tools/dataset_converters/o365_to_coco.py'
MAP = osp.join(PROJECT_ROOT, 'mmcalidet', 'data', 'o365_to_coco_map.json')

#: Objects365 names (with their spellings and the paper's ids) and a few
#: categories COCO does not have
O365_CATEGORIES = [
    dict(id=1, name='Person'),
    dict(id=57, name='Wild Bird'),
    dict(id=165, name='Pigeon'),
    dict(id=320, name='Parrot'),
    dict(id=99, name='Dinning Table'),
    dict(id=38, name='Moniter/TV'),
    dict(id=365, name='Table Tennis '),
    dict(id=211, name='Tennis'),
    dict(id=6, name='Traffic Light'),
    dict(id=7, name='Lamp'),
    dict(id=8, name='Street Lights'),
    dict(id=9, name='Bird Cage'),
]


def fixture():
    images = [
        dict(id=i, file_name=f'obj365_val_{i:06d}.jpg', width=640, height=480)
        for i in (10, 11, 12, 13)
    ]
    anns = []

    def ann(img, cat):
        anns.append(
            dict(
                id=len(anns) + 1,
                image_id=img,
                category_id=cat,
                bbox=[10, 20, 30, 40],
                area=1200.0,
                iscrowd=0))

    for cat in (1, 57, 7):  # person, bird, lamp
        ann(10, cat)
    for cat in (7, 8, 9):  # only non-COCO classes: the image is dropped
        ann(11, cat)
    for cat in (165, 320, 99, 38):  # bird, bird, dining table, tv
        ann(12, cat)
    for cat in (365, 211, 6):  # sports ball x2, traffic light
        ann(13, cat)
    return dict(
        info=dict(description='o365 fixture'),
        images=images,
        annotations=anns,
        categories=O365_CATEGORIES)


@pytest.fixture
def tool():
    return runpy.run_path(osp.join(PROJECT_ROOT, TOOL), run_name='tool')


def test_convert_counts_and_ids(tool):
    cats, manual = tool['load_mapping'](MAP)
    assert len(cats) == 80 and len({c['id'] for c in cats}) == 80
    coco_id = {c['name']: c['id'] for c in cats}
    out, report = tool['convert'](fixture(), cats, manual)
    assert [img['id'] for img in out['images']] == [10, 12, 13]
    assert report['images_total'] == 4 and report['images_kept'] == 3
    assert report['annotations_total'] == 13
    assert report['annotations_kept'] == 9
    assert report['annotations_kept_pct'] == pytest.approx(100 * 9 / 13)
    by_image = {}
    for a in out['annotations']:
        by_image.setdefault(a['image_id'], []).append(a['category_id'])
    assert by_image == {
        10: [coco_id['person'], coco_id['bird']],
        12: [coco_id['bird']] * 2 + [coco_id['dining table'], coco_id['tv']],
        13: [coco_id['sports ball']] * 2 + [coco_id['traffic light']],
    }
    assert (coco_id['bird'], coco_id['sports ball']) == (16, 37)
    assert out['categories'] == cats  # COCO ids and names
    assert out['info'] == dict(description='o365 fixture')
    ann = out['annotations'][0]
    assert ann['bbox'] == [10, 20, 30, 40] and ann['id'] == 1
    assert report['annotations_per_class']['bird'] == 3
    # 'Bird Cage' is not a bird; unmatched COCO classes are reported
    assert 'car' in report['unmatched_coco']
    assert 'person' not in report['unmatched_coco']
    assert 'Soccer' in report['missing_manual']


def test_mapping_table_is_the_supplementary():
    with open(MAP) as f:
        manual = json.load(f)['manual']
    assert manual['bird'] == ['Wild Bird', 'Pigeon', 'Parrot']
    assert len(manual['sports ball']) == 10
    assert manual['dining table'] == ['Dinning Table']
    assert len(manual) == 11


@pytest.mark.slow
def test_cli(run_tool, tmp_path):
    src = tmp_path / 'o365.json'
    src.write_text(json.dumps(fixture()))
    out = tmp_path / 'coco' / 'o365_coco.json'
    proc = run_tool(TOOL, str(src), str(out))
    assert proc.returncode == 0, proc.stderr
    # the fixture: image 11 holds only non-COCO classes, 4 of its 13
    # boxes (3 of image 11, the lamp of image 10) have no COCO class
    with open(out) as f:
        converted = json.load(f)
    assert [img['id'] for img in converted['images']] == [10, 12, 13]
    assert len(converted['annotations']) == 9
    with open(tmp_path / 'coco' / 'o365_coco.report.json') as f:
        report = json.load(f)
    assert (report['images_kept'], report['images_total']) == (3, 4)
    assert (report['annotations_kept'], report['annotations_total']) == \
        (9, 13)
    bad = tmp_path / 'bad.json'
    bad.write_text('{"images": []}')
    proc = run_tool(TOOL, str(bad), str(tmp_path / 'x.json'))
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith('no "annotations" list')
    assert not (tmp_path / 'x.json').exists()
