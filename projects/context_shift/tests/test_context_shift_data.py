# Copyright (c) mmcalidet contributors. All rights reserved.
"""The context-shift benchmark generator."""
import copy
import hashlib
import json
import os
import os.path as osp
import runpy

import numpy as np
import pytest

from mmcalidet.priors import batch_prior, flat_prior, load_prior
from mmcalidet.priors.label_io import read_coco_labels
from projects.context_shift.context_shift.data import (
    CLASSES, DEFAULT_SCENES, MANY_CLASS_SCENES, expected_site_statistics,
    label_statistics, load_digits_split, make_context_shift, variant_classes)
from testing import PROJECT_ROOT, run_tool_in_process

MAKE_DATA = 'projects/context_shift/tools/make_data.py'
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


def _without_swapped(scenes):
    scenes = copy.deepcopy(scenes)
    del scenes['sites']['swapped']
    return scenes


def test_default_output_unchanged(tmp_path):
    # the ``swapped`` site was added later, last, so with it left out the
    # folder is exactly the one the digest was taken on
    make_context_shift(
        str(tmp_path / 'cs'),
        seed=3,
        scenes=_without_swapped(DEFAULT_SCENES),
        **SMALL)
    assert _digest(str(tmp_path / 'cs')) == DEFAULT_DIGEST
    # and adding it leaves the train split and the earlier sites as they were
    make_context_shift(str(tmp_path / 'with'), seed=3, **SMALL)
    names = ['instances_train.json'] + [
        f'instances_val_{site}.json' for site in DEFAULT_SCENES['sites']
        if site != 'swapped'
    ]
    for name in names:
        assert _read(tmp_path / 'with' / 'annotations' / name) == \
            _read(tmp_path / 'cs' / 'annotations' / name)
    assert (tmp_path / 'with' / 'annotations' /
            'instances_val_swapped.json').is_file()


@pytest.mark.parametrize('variant', ['digits', 'many-class'])
def test_swapped_site_is_a_relation_site(variant):
    train = expected_site_statistics(None, variant)
    swapped = expected_site_statistics('swapped', variant)
    # class frequencies within 20 % of training's (per object and per image)
    for key in ('object_share', 'image_frequency'):
        ratio = swapped[key] / train[key]
        assert np.all(np.abs(ratio - 1) <= 0.2), (key, ratio)
    classes = variant_classes(variant)
    if variant == 'digits':
        # 7 among the left digits, 1 among the right ones
        groups = {7: [0, 3, 4, 5], 1: [6, 8, 9]}
        pairs = [(1, 7)]
    else:
        k = len(CLASSES)
        # the look-alike styles each with the other group's distinct style
        groups = {c: list(range(3 * k, 4 * k)) for c in range(k)}  # red-blue
        groups.update({k + c: list(range(2 * k, 3 * k))
                       for c in range(k)})  # orange-green
        pairs = [(c, k + c) for c in range(k)]
    for c, others in groups.items():
        # in training they meet only in the few mixed scenes
        before = train['cooccurrence'][c, others]
        after = swapped['cooccurrence'][c, others]
        assert np.all(after > 3 * before), classes[c]
    for a, b in pairs:
        # both members of each look-alike pair occur at the site
        assert swapped['image_frequency'][a] > 0.05
        assert swapped['image_frequency'][b] > 0.05
    # every existing site is kept
    scenes = DEFAULT_SCENES if variant == 'digits' else MANY_CLASS_SCENES
    assert list(scenes['sites']) == [
        'like_train', 'left_only', 'crossed', 'swapped'
    ]


def test_expected_site_statistics_agree_with_draws():
    stats = expected_site_statistics('swapped', 'digits', objects=(2, 6))
    assert stats['object_share'].sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.diag(stats['cooccurrence']),
                               stats['image_frequency'])
    rng = np.random.default_rng(0)
    spec = DEFAULT_SCENES['sites']['swapped']
    types = dict(DEFAULT_SCENES['scene_types'], **spec['scene_types'])
    names = list(spec['mixture'])
    weights = np.array(list(spec['mixture'].values()))
    present = np.zeros((20000, 10), bool)
    for row in present:
        table = np.asarray(types[names[rng.choice(3, p=weights)]], float)
        n = rng.integers(2, 7)
        row[rng.choice(10, n, p=table / table.sum())] = True
    np.testing.assert_allclose(present.mean(0), stats['image_frequency'],
                               atol=0.02)
    both = present[:, 3] & present[:, 7]
    assert both.mean() == pytest.approx(stats['cooccurrence'][3, 7],
                                        abs=0.02)
    with pytest.raises(ValueError, match='unknown site'):
        expected_site_statistics('nowhere')
    with pytest.raises(ValueError, match='objects'):
        expected_site_statistics('swapped', objects=(3, 1))


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


@pytest.mark.slow
def test_existing_folder_and_bad_scene_model(tmp_path, capsys):
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
    small = [
        '--out',
        str(out), '--num-train', '4', '--num-val-per-site', '2', '--img-size',
        '64', '--digit-size', '8', '12', '--no-progress'
    ]
    # from the command line: exit status 1 and the reason
    res = run_tool_in_process(MAKE_DATA, *small)
    assert res.returncode == 1 and 'exists' in res.stderr
    # the options reach the generator (in this process: the start-up is
    # the run above's)
    tool = runpy.run_path(osp.join(PROJECT_ROOT, MAKE_DATA), run_name='tool')
    assert tool['main'](small + ['--overwrite']) == 0
    assert 'epsilon(E_crossed, E_t)' in capsys.readouterr().out
    assert not (out / 'keep.txt').exists()
    assert not osp.exists(str(out) + '.partial')
    assert tool['main'](
        small +
        ['--overwrite', '--variant', 'many-class', '--hue-jitter', '5']) == 0
    printed = capsys.readouterr().out
    assert '(many-class, 40 classes)' in printed
    assert "of 40 classes per image" in printed
    meta = _read(out / 'meta.json')
    assert meta['hue_jitter'] == 5 and meta['objects'] == [2, 4]


def test_default_statistics(tmp_path):
    meta = make_context_shift(str(tmp_path / 'cs'), seed=0, **SMALL)
    assert meta['variant'] == 'digits' and meta['num_classes'] == 10
    sets = read_coco_labels(
        str(tmp_path / 'cs' / 'annotations' / 'instances_train.json'))
    distinct = [len(set(labels)) for labels in sets.label_lists()]
    stats = meta['statistics']['train']
    assert stats['classes_per_image'] == pytest.approx(np.mean(distinct),
                                                       abs=1e-4)
    assert stats['ex_columns_off_e0'] == pytest.approx(
        np.mean(distinct) / 10, abs=1e-4)
    assert set(meta['statistics']) == {'train', 'val'} | {
        f'val_{site}'
        for site in DEFAULT_SCENES['sites']
    }


def test_label_statistics_match_e_x():
    """The share of E_x's columns off E0 is the definition's."""
    label_lists = [[0, 3, 3], [5, 1], [7, 7, 7, 2, 9]]
    stats = label_statistics(label_lists, 12)
    off = [
        np.mean(np.any(batch_prior(12, [labels]) != flat_prior(12), axis=0))
        for labels in label_lists
    ]
    assert stats['ex_columns_off_e0'] == pytest.approx(np.mean(off),
                                                       abs=1e-4)
    assert stats['objects_per_image'] == pytest.approx(10 / 3, abs=1e-4)
    assert stats['classes_per_image'] == pytest.approx(7 / 3, abs=1e-4)
    assert stats['classes_per_image_range'] == [2, 3]
    with pytest.raises(ValueError, match='at least one image'):
        label_statistics([], 12)


MANY = dict(num_train=120, num_val_per_site=40, img_size=64,
            digit_size=(8, 12), progress=False, variant='many-class')


def _groups(classes):
    """Indices of the left (red, green) and right (orange, blue) classes,
    and of the red / orange look-alikes."""
    def idx(style):
        return [k for k, c in enumerate(classes) if c.endswith('_' + style)]

    return dict(left=idx('red') + idx('green'),
                right=idx('orange') + idx('blue'), red=idx('red'),
                orange=idx('orange'), green=idx('green'), blue=idx('blue'))


def _block(prior, rows, cols):
    """Mean of prior[rows, cols] without the diagonal."""
    values = [prior[i, j] for i in rows for j in cols if i != j]
    return float(np.mean(values))


def test_many_class_variant(tmp_path):
    meta = make_context_shift(str(tmp_path / 'mc'), seed=0, **MANY)
    root = tmp_path / 'mc'
    classes = variant_classes('many-class')
    k = len(classes)
    assert k >= 40 and meta['num_classes'] == k
    assert meta['classes'] == list(classes) and 'three_orange' in classes
    assert (root / 'classes.txt').read_text().split() == list(classes)
    # 2-4 objects of distinct classes in every image, train and val
    for name in ('instances_train.json', 'instances_val.json'):
        data = _read(root / 'annotations' / name)
        assert [c['name'] for c in data['categories']] == list(classes)
        per_image = {img['id']: [] for img in data['images']}
        for ann in data['annotations']:
            per_image[ann['image_id']].append(ann['category_id'])
        assert all(2 <= len(v) <= 4 and len(set(v)) == len(v)
                   for v in per_image.values())
    # the statistics: about 3 of K classes per image
    for split, stats in meta['statistics'].items():
        assert 2 <= stats['classes_per_image'] <= 4, split
        assert stats['classes_per_image'] == stats['objects_per_image']
        assert stats['ex_columns_off_e0'] == pytest.approx(
            stats['classes_per_image'] / k, abs=1e-4)
        assert stats['ex_columns_off_e0'] < 0.1
    # look-alikes: the same digit in the red and the orange style
    g = _groups(classes)
    assert sorted(map(tuple, meta['lookalikes'])) == sorted(
        zip(g['red'], g['orange']))
    # E_t: a class comes with its own group, rarely with the other group's
    # classes, and a look-alike almost never with its twin
    e_t = load_prior(str(root / 'priors' / 'E_t.json'))
    for group, other in (('left', 'right'), ('right', 'left')):
        within = _block(e_t, g[group], g[group])
        across = _block(e_t, g[other], g[group])
        assert within > 0.05 and across < within / 5, (group, within,
                                                       across)
    twins = np.mean([e_t[j, i] for i, j in meta['lookalikes']])
    assert twins < 0.02
    # the crossed site puts the red look-alikes beside the blue classes
    e_crossed = load_prior(str(root / 'priors' / 'E_crossed.json'))
    assert _block(e_crossed, g['blue'], g['red']) > \
        3 * _block(e_t, g['blue'], g['red'])
    assert _block(e_crossed, g['green'], g['red']) < \
        _block(e_t, g['green'], g['red']) / 3
    assert meta['epsilon']['crossed'] > meta['epsilon']['like_train']
    # same seed, same data
    again = make_context_shift(str(tmp_path / 'again'), seed=0, **MANY)
    assert again == meta
    assert _read(root / 'annotations' / 'instances_val.json') == _read(
        tmp_path / 'again' / 'annotations' / 'instances_val.json')
    # the hue jitter changes the colours only: same scenes, same priors
    other = make_context_shift(
        str(tmp_path / 'jitter'), seed=0, hue_jitter=16.0, **MANY)
    assert other['hue_jitter'] == 16.0 and meta['hue_jitter'] == 8.0
    assert other['epsilon'] == meta['epsilon']
    for name in ('instances_train.json', 'instances_val.json'):
        assert _read(root / 'annotations' / name) == _read(
            tmp_path / 'jitter' / 'annotations' / name)
    img = 'images/train/train_000003.png'
    assert (root / img).read_bytes() == (tmp_path / 'again' /
                                         img).read_bytes()
    assert (root / img).read_bytes() != (tmp_path / 'jitter' /
                                         img).read_bytes()


def test_many_class_look_alike_colours(tmp_path):
    """Red and orange objects have close colours, green and blue ones far
    from them and from each other."""
    from PIL import Image
    make_context_shift(str(tmp_path / 'mc'), seed=1, **MANY)
    data = _read(tmp_path / 'mc' / 'annotations' / 'instances_train.json')
    names = {c['id']: c['name'] for c in data['categories']}
    files = {img['id']: img['file_name'] for img in data['images']}
    chroma = {style: [] for style in MANY_CLASS_SCENES['styles']}
    for ann in data['annotations']:
        with Image.open(tmp_path / 'mc' / 'images' /
                        files[ann['image_id']]) as img:
            pixels = np.asarray(img, np.float64)
        x, y, w, h = ann['bbox']
        patch = pixels[y:y + h, x:x + w].reshape(-1, 3)
        # the digit's own pixels (bright); colour without brightness
        bright = patch[patch.sum(1) > np.percentile(patch.sum(1), 80)]
        rgb = bright.mean(0)
        chroma[names[ann['category_id']].split('_')[1]].append(
            rgb / rgb.sum())
    mean = {style: np.mean(v, 0) for style, v in chroma.items()}

    def dist(a, b):
        return float(np.linalg.norm(mean[a] - mean[b]))

    near = dist('red', 'orange')
    assert 0 < near < dist('red', 'green') / 3
    assert near < dist('orange', 'blue') / 3
    assert near < dist('green', 'blue') / 3


def test_many_class_bad_input(tmp_path):
    out = str(tmp_path / 'x')
    small = dict(MANY, num_train=4, num_val_per_site=2)
    with pytest.raises(ValueError, match="unknown variant 'many'"):
        make_context_shift(out, **dict(small, variant='many'))
    with pytest.raises(ValueError, match='hue_jitter .* belongs to the many'):
        make_context_shift(out, hue_jitter=3.0, **SMALL)
    with pytest.raises(ValueError, match='"styles" belongs'):
        make_context_shift(out, scenes=MANY_CLASS_SCENES, **SMALL)
    bad = dict(MANY_CLASS_SCENES,
               scene_types=dict(MANY_CLASS_SCENES['scene_types'],
                                left={'*_purple': 1}))
    with pytest.raises(ValueError, match="'\\*_purple' names no class"):
        make_context_shift(out, scenes=bad, **small)
    bad = dict(MANY_CLASS_SCENES,
               scene_types=dict(MANY_CLASS_SCENES['scene_types'],
                                left={'one_red': 1, 'seven_green': 1}))
    with pytest.raises(ValueError, match="'left' .* 2 classes, fewer than "
                       'the 4 distinct objects'):
        make_context_shift(out, scenes=bad, **small)
    bad = dict(MANY_CLASS_SCENES, lookalikes=[['red', 'pink']])
    with pytest.raises(ValueError, match="unknown style 'pink'"):
        make_context_shift(out, scenes=bad, **small)
    assert not osp.exists(out)
    # two styles: 20 classes; tables as lists of K weights work too
    two = dict(MANY_CLASS_SCENES, styles={'red': 0, 'blue': 220},
               lookalikes=[],
               scene_types={'a': [1] * 20},
               train_mixture={'a': 1},
               sites={'s': {'mixture': {'a': 1}}})
    meta = make_context_shift(out, scenes=two, **small)
    assert meta['num_classes'] == 20 and meta['classes'][-1] == 'nine_blue'
