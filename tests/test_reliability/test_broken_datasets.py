# Copyright (c) mmcalidet contributors. All rights reserved.
"""Broken datasets: corrupt and missing images, unknown category ids and
labels the model does not have, with the exact error each gives."""
import json

import cv2
import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmdet.utils import register_all_modules

from mmcalidet.models import EdgeSampler
from mmcalidet.priors.label_io import read_coco_labels
from testing import demo_batch

register_all_modules()
CLASSES = ('person', 'bicycle')
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs')
]


def coco_folder(root, files, extra_annotations=()):
    """Images (name -> bytes or None for absent) and a COCO file with one
    person box per image."""
    images, annotations = [], []
    for k, (name, data) in enumerate(files.items(), start=1):
        if data is not None:
            (root / name).write_bytes(data)
        images.append(dict(id=k, file_name=name, width=32, height=32))
        annotations.append(
            dict(
                id=k,
                image_id=k,
                category_id=1,
                bbox=[2, 2, 10, 10],
                area=100,
                iscrowd=0))
    for k, ann in enumerate(extra_annotations, start=len(annotations) + 1):
        annotations.append(
            dict(id=k, bbox=[4, 4, 8, 8], area=64, iscrowd=0, **ann))
    categories = [dict(id=1, name='person'), dict(id=2, name='bicycle')]
    (root / 'ann.json').write_text(
        json.dumps(
            dict(
                images=images, annotations=annotations,
                categories=categories)))
    return CocoDataset(
        data_root=str(root),
        ann_file='ann.json',
        data_prefix=dict(img=''),
        pipeline=PIPELINE,
        metainfo=dict(classes=CLASSES),
        test_mode=True)


def jpeg(seed=0):
    img = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), np.uint8)
    ok, buf = cv2.imencode('.jpg', img)
    assert ok
    return buf.tobytes()


def test_corrupt_and_missing_images(tmp_path):
    good = jpeg()
    dataset = coco_folder(
        tmp_path, {
            'good.jpg': good,
            'noise.jpg': np.random.default_rng(1).bytes(500),
            'truncated.jpg': good[:len(good) // 2],
            'empty.jpg': b'',
            'absent.jpg': None,
        })
    assert dataset[0]['inputs'].shape == (3, 32, 32)
    for index, name in ((1, 'noise.jpg'), (2, 'truncated.jpg')):
        with pytest.raises(AssertionError) as info:
            dataset[index]
        assert str(info.value) == f'failed to load image: {tmp_path / name}'
    with pytest.raises(cv2.error, match=r'!buf.empty\(\)'):
        dataset[3]
    with pytest.raises(FileNotFoundError) as info:
        dataset[4]
    assert str(info.value) == \
        f"[Errno 2] No such file or directory: '{tmp_path / 'absent.jpg'}'"


def test_unknown_category_ids(tmp_path):
    dataset = coco_folder(
        tmp_path, {'a.jpg': jpeg()},
        extra_annotations=[dict(image_id=1, category_id=999)])
    # mmdet's CocoDataset drops annotations of categories it does not
    # select, unknown ids included, without a word ...
    assert dataset.get_data_info(0)['instances'][0]['bbox_label'] == 0
    assert len(dataset.get_data_info(0)['instances']) == 1
    # ... the relation statistics (tools/analysis_tools/compute_prior.py)
    # refuse the file
    with pytest.raises(ValueError) as info:
        read_coco_labels(str(tmp_path / 'ann.json'))
    assert str(info.value) == \
        f'{tmp_path / "ann.json"}: annotation 2 has unknown category id 999'


@pytest.mark.parametrize('label, message', [
    (4, 'label_lists[0]: class index 4 is out of range for num_classes=4'),
    (-1, 'label_lists[0]: class index -1 is negative'),
])
def test_labels_beyond_the_model_classes(label, message):
    sampler = EdgeSampler(num_classes=4, mode_probs=dict(sample=1.0))
    batch = demo_batch([[1, label]], size=8)
    with pytest.raises(ValueError) as info:
        sampler(torch.stack(batch['inputs']).float(), batch['data_samples'])
    assert str(info.value) == message
