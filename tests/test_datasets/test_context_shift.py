# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark generator."""
import hashlib
import json
import os
import os.path as osp

import numpy as np
import pytest

from mmcalidet.datasets.context_shift import (CLASSES, DEFAULT_SCENES,
                                              load_digits_split,
                                              make_context_shift)
from mmcalidet.priors import batch_prior, load_prior
from mmcalidet.priors.label_io import read_coco_labels

SMALL = dict(num_train=24, num_val_per_site=12, img_size=64,
             digit_size=(8, 14), progress=False)

#: digest of the default benchmark made with ``seed=3`` and :data:`SMALL`
#: (annotation files, prior matrices, decoded pixels), computed before the
#: many-class variant was added: the default data must not change
DEFAULT_DIGEST = \
    'ab0ef32e9f1cc8e472b1604209c54512e392c965202182ee59fc5de9689c5bbb'


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_deterministic_by_seed(tmp_path):
    a = make_context_shift(str(tmp_path / 'a'), seed=3, **SMALL)
    b = make_context_shift(str(tmp_path / 'b'), seed=3, **SMALL)
    c = make_context_shift(str(tmp_path / 'c'), seed=4, **SMALL)
    assert a == b and a['epsilon'] != c['epsilon']
    for name in ('instances_train.json', 'instances_val.json'):
        assert _read(tmp_path / 'a' / 'annotations' / name) == \
            _read(tmp_path / 'b' / 'annotations' / name)
    img = 'images/train/train_000005.png'
    assert (tmp_path / 'a' / img).read_bytes() == \
        (tmp_path / 'b' / img).read_bytes()
    assert (tmp_path / 'a' / img).read_bytes() != \
        (tmp_path / 'c' / img).read_bytes()


def _digest(root) -> str:
    """SHA-256 over a generated folder's annotation files (bytes), prior
    matrices (float64) and images (decoded pixels, so PNG encoder settings
    do not matter)."""
    from PIL import Image
    h = hashlib.sha256()
    for name in sorted(os.listdir(osp.join(root, 'annotations'))):
        h.update(name.encode())
        with open(osp.join(root, 'annotations', name), 'rb') as f:
            h.update(f.read())
    for name in sorted(os.listdir(osp.join(root, 'priors'))):
        h.update(name.encode())
        prior = load_prior(osp.join(root, 'priors', name))
        h.update(np.ascontiguousarray(prior, np.float64).tobytes())
    for folder in ('train', 'val'):
        for name in sorted(os.listdir(osp.join(root, 'images', folder))):
            h.update(name.encode())
            with Image.open(osp.join(root, 'images', folder, name)) as img:
                h.update(np.asarray(img).tobytes())
    return h.hexdigest()


def test_default_output_unchanged(tmp_path):
    make_context_shift(str(tmp_path / 'cs'), seed=3, **SMALL)
    assert _digest(str(tmp_path / 'cs')) == DEFAULT_DIGEST


def test_held_out_appearances():
    train, val = load_digits_split()
    for c in range(len(CLASSES)):
        flat_t = {s.tobytes() for s in train[c]}
        assert not any(s.tobytes() in flat_t for s in val[c])
        assert len(val[c]) > 50 and len(train[c]) > 90


def test_annotations_and_priors_agree(tmp_path):
    meta = make_context_shift(str(tmp_path / 'cs'), seed=0, **SMALL)
    root = tmp_path / 'cs'
    train = _read(root / 'annotations' / 'instances_train.json')
    assert len(train['images']) == 24
    assert [c['name'] for c in train['categories']] == list(CLASSES)
    for ann in train['annotations']:
        x, y, w, h = ann['bbox']
        assert 0 <= x and x + w <= 64 and 0 <= y and y + h <= 64
    for img in train['images']:
        assert osp.isfile(root / 'images' / img['file_name'])
    sets = read_coco_labels(str(root / 'annotations' /
                                'instances_train.json'))
    np.testing.assert_array_equal(
        load_prior(str(root / 'priors' / 'E_t.json')),
        batch_prior(10, sets.label_lists()))
    e_t, e_t_meta = load_prior(
        str(root / 'priors' / 'E_t.json'), return_meta=True)
    # class frequencies beside E_t (the marginal re-weighting baseline)
    counts = np.zeros(10, np.int64)
    for labels in sets.label_lists():
        counts[np.unique(labels)] += 1
    assert e_t_meta['images_per_class'] == {
        c: int(n)
        for c, n in zip(CLASSES, counts)
    }
    assert e_t_meta['num_images'] == 24
    for site in DEFAULT_SCENES['sites']:
        path = root / 'annotations' / f'instances_val_{site}.json'
        e_site = batch_prior(10, read_coco_labels(str(path)).label_lists())
        np.testing.assert_array_equal(
            load_prior(str(root / 'priors' / f'E_{site}.json')), e_site)
        assert meta['epsilon'][site] == pytest.approx(
            np.abs(e_site - e_t).mean())
    # the shifted sites differ from E_t more than the train-like one
    assert meta['epsilon']['crossed'] > meta['epsilon']['like_train']
    val = _read(root / 'annotations' / 'instances_val.json')
    assert len(val['images']) == 12 * len(DEFAULT_SCENES['sites'])
    assert len({img['id'] for img in val['images']}) == len(val['images'])


def test_existing_folder_and_bad_scene_model(tmp_path, run_tool):
    out = tmp_path / 'cs'
    out.mkdir()
    (out / 'keep.txt').write_text('x')
    with pytest.raises(ValueError, match='exists'):
        make_context_shift(str(out), **SMALL)
    assert (out / 'keep.txt').read_text() == 'x'
    bad = dict(DEFAULT_SCENES, train_mixture={'nowhere': 1.0})
    with pytest.raises(ValueError, match="unknown scene type 'nowhere'"):
        make_context_shift(str(tmp_path / 'x'), scenes=bad, **SMALL)
    bad = dict(DEFAULT_SCENES,
               scene_types=dict(DEFAULT_SCENES['scene_types'], left=[1, 2]))
    with pytest.raises(ValueError, match='2 weights'):
        make_context_shift(str(tmp_path / 'x'), scenes=bad, **SMALL)
    assert not osp.exists(tmp_path / 'x')
    res = run_tool('tools/dataset_converters/make_context_shift.py', '--out',
                   str(out), '--num-train', '4', '--num-val-per-site', '2',
                   '--img-size', '64', '--digit-size', '8', '12',
                   '--no-progress')
    assert res.returncode == 1 and 'exists' in res.stderr
    res = run_tool('tools/dataset_converters/make_context_shift.py', '--out',
                   str(out), '--num-train', '4', '--num-val-per-site', '2',
                   '--img-size', '64', '--digit-size', '8', '12',
                   '--no-progress', '--overwrite')
    assert res.returncode == 0, res.stderr
    assert 'epsilon(E_crossed, E_t)' in res.stdout
    assert not (out / 'keep.txt').exists()
    assert not osp.exists(str(out) + '.partial')
