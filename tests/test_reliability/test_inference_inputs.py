# Copyright (c) mmcalidet contributors. All rights reserved.
"""``inference_detector`` checks its images before the model runs: an
empty list, files mixed with arrays, a missing, empty or truncated file, an
array that is 0 x 0, 2-D or holds NaN is one line naming the input (an
all-NaN image gave 0 detections with no error)."""
import glob
import os.path as osp

import numpy as np
import pytest

from mmcalidet.apis import inference_detector
from mmcalidet.apis.image_inputs import check_inference_images
from testing import data_root

IMAGES = sorted(
    glob.glob(
        osp.join(data_root(), 'coco-mini', 'images', 'val2017', '*.jpg')))
GOOD = np.zeros((8, 10, 3), np.uint8)


def refused(imgs, problem: str) -> str:
    """The one-line refusal of ``imgs``, by the check and by
    ``inference_detector`` (before any use of the model: none is given)."""
    with pytest.raises(ValueError, match=problem) as exc:
        check_inference_images(imgs)
    message = str(exc.value)
    assert '\n' not in message
    with pytest.raises(ValueError, match=problem):
        inference_detector(None, imgs)
    return message


def test_valid_inputs_pass():
    assert IMAGES, 'the coco-mini images are needed'
    assert check_inference_images(IMAGES[0]) == [IMAGES[0]]
    assert len(check_inference_images([IMAGES[0], IMAGES[1]])) == 2
    assert len(check_inference_images((GOOD, GOOD.astype(np.float32)))) == 2
    # storage backends are left to mmengine's reader
    check_inference_images('s3://bucket/image.jpg')


def test_no_images():
    refused([], r'no images given \(an empty list\)')
    refused((), 'no images given')


@pytest.mark.parametrize('array, problem', [
    (np.zeros((0, 0, 3), np.uint8), r'is empty \(shape \(0, 0, 3\)\)'),
    (np.zeros((5, 5), np.uint8), r'H x W x 3 \(BGR\) array, got shape '
     r'\(5, 5\)'),
    (np.zeros((5, 5, 4), np.uint8), r'got shape \(5, 5, 4\)'),
    (np.full((5, 5, 3), np.nan, np.float32), 'holds a non-finite value'),
    (np.full((5, 5, 3), 'a'), 'must be an array of numbers'),
])
def test_bad_arrays_are_named(array, problem):
    assert refused(array, problem).startswith('the image')
    assert refused([GOOD, array], problem).startswith('image 1 of 2')


def test_files_mixed_with_arrays_are_refused():
    message = refused([IMAGES[0], GOOD], 'mix files and arrays')
    assert 'image 0 is a file, image 1 an array' in message
    refused([GOOD, IMAGES[0]], 'image 0 is an array, image 1 a file')
    refused([IMAGES[0], 3], 'image 1 of 2 must be an image file or an H x W '
            'x 3 array, got int')


def test_bad_files_are_named(tmp_path):
    missing = str(tmp_path / 'missing.jpg')
    assert missing in refused(missing, 'image file not found')
    empty = tmp_path / 'empty.jpg'
    empty.write_bytes(b'')
    assert str(empty) in refused([IMAGES[0], str(empty)],
                                 '^image 1 of 2: image file is empty')
    truncated = tmp_path / 'truncated.jpg'
    with open(IMAGES[0], 'rb') as f:
        data = f.read()
    truncated.write_bytes(data[:len(data) // 2])
    assert str(truncated) in refused(str(truncated), 'unreadable image')
    text = tmp_path / 'notes.jpg'
    text.write_text('not an image')
    refused(str(text), 'not an image')
    refused(str(tmp_path), 'not a file')
