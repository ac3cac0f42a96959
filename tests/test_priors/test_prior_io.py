# Copyright (c) mmcalidet contributors. All rights reserved.
"""Prior files: format, reordering by class name, validation errors."""
import json
import os

import numpy as np
import pytest

from mmcalidet.priors import (batch_prior, default_prior_path, load_prior,
                              save_prior, validate_prior)

CLASSES = ['person', 'bicycle', 'car']


@pytest.fixture
def prior():
    return batch_prior(3, [[0, 1], [0], [2, 0], [1]])


def test_roundtrip_json_and_meta(tmp_path, prior):
    path = str(tmp_path / 'p.json')
    save_prior(path, prior, CLASSES, source='unit', num_images=4)
    with open(path) as f:
        data = json.load(f)
    assert data['classes'] == CLASSES
    assert data['source'] == 'unit' and data['num_images'] == 4
    loaded, meta = load_prior(path, return_meta=True)
    np.testing.assert_array_equal(loaded, prior)
    assert meta['classes'] == CLASSES and meta['num_images'] == 4


def test_roundtrip_npy(tmp_path, prior):
    path = str(tmp_path / 'p.npy')
    save_prior(path, prior)
    np.testing.assert_array_equal(load_prior(path), prior)
    np.testing.assert_array_equal(load_prior(path, classes=CLASSES), prior)
    with pytest.raises(ValueError, match='K=3 classes, expected 2'):
        load_prior(path, classes=['a', 'b'])


def test_reorder_by_class_name(tmp_path, prior):
    path = str(tmp_path / 'p.json')
    save_prior(path, prior, CLASSES)
    order = ['car', 'person', 'bicycle']
    loaded = load_prior(path, classes=order)
    idx = [CLASSES.index(c) for c in order]
    np.testing.assert_array_equal(loaded, prior[np.ix_(idx, idx)])
    # P(person | bicycle) is the same number in both orders
    assert loaded[1, 2] == prior[0, 1]


@pytest.mark.parametrize('classes, message', [
    (['person', 'bicycle', 'truck'], "'truck' is not in the prior file"),
    (['person', 'bicycle'], "'car' is missing"),
    (['person', 'person', 'car'], "duplicated class name 'person'"),
    (['persn', 'bicycle', 'car'], "did you mean 'person'"),
])
def test_reorder_errors(tmp_path, prior, classes, message):
    path = str(tmp_path / 'p.json')
    save_prior(path, prior, CLASSES)
    with pytest.raises(ValueError, match=message):
        load_prior(path, classes=classes)


@pytest.mark.parametrize('matrix, message', [
    (np.ones((2, 3)), 'square'),
    (np.ones((2, 2, 2)), 'square'),
    ([[1, np.nan], [0, 1]], 'non-finite'),
    ([[1, np.inf], [0, 1]], 'non-finite'),
    ([[1, -0.2], [0, 1]], r'\[0, 1\]'),
    ([[1, 1.5], [0, 1]], r'\[0, 1\]'),
    ([[0.9, 0.5], [0.5, 1]], 'diagonal must be 1'),
    ('[[1, 0], [0, 1]]', 'string'),
    ([['a', 'b'], ['c', 'd']], 'numeric'),
    (np.zeros((0, 0)), 'empty'),
])
def test_validate_errors(matrix, message):
    with pytest.raises(ValueError, match=message):
        validate_prior(matrix)


def test_validate_wrong_k_and_reset_diagonal():
    with pytest.raises(ValueError, match='K=2 classes, expected 3'):
        validate_prior(np.eye(2), num_classes=3)
    fixed = validate_prior([[0.2, 0.5], [0.5, 0.0]], reset_diagonal=True)
    np.testing.assert_array_equal(np.diag(fixed), 1)


def test_validate_accepts_tensor():
    torch = pytest.importorskip('torch')
    out = validate_prior(torch.eye(3))
    assert isinstance(out, np.ndarray) and out.dtype == np.float64


@pytest.mark.parametrize('content, message', [
    ('', 'empty'),
    ('{"classes": ["a"], "matrix": [[1]', 'not valid JSON'),
    ('[1, 2]', 'JSON object'),
    ('{"classes": ["a", "b"]}', 'no "matrix"'),
    ('{"classes": ["a", "b"], "matrix": "[[1,0],[0,1]]"}', 'string'),
    ('{"classes": ["a", "b", "c"], "matrix": [[1, 0], [0, 1]]}',
     '3 class names for a 2 x 2'),
    ('{"classes": ["a", "a"], "matrix": [[1, 0], [0, 1]]}', 'duplicated'),
    ('{"classes": ["a", "b"], "matrix": [[1, 0], [0, 1, 0]]}', 'numeric'),
])
def test_bad_files(tmp_path, content, message):
    path = tmp_path / 'bad.json'
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prior(str(path))


def test_missing_device_and_huge_files(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='not found'):
        load_prior(str(tmp_path / 'nope.json'))
    link = tmp_path / 'zero.json'
    os.symlink('/dev/zero', link)
    with pytest.raises(ValueError, match='not a regular file'):
        load_prior(str(link))
    big = tmp_path / 'big.json'
    with open(big, 'wb') as f:
        f.truncate(65 * 1024 * 1024)  # sparse: no disk used
    with pytest.raises(ValueError, match='too large'):
        load_prior(str(big))


def test_save_is_atomic_and_validates(tmp_path, prior):
    path = tmp_path / 'p.json'
    save_prior(str(path), prior, CLASSES)
    before = path.read_text()
    with pytest.raises(ValueError, match='diagonal'):
        save_prior(str(path), np.full((3, 3), 0.5), CLASSES)
    with pytest.raises(ValueError, match='2 class names'):
        save_prior(str(path), prior, CLASSES[:2])
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ['p.json']


def test_shipped_coco_priors():
    priors = {}
    for name in ('coco2017_train', 'coco2017_val'):
        priors[name], meta = load_prior(
            default_prior_path(name), return_meta=True)
        assert priors[name].shape == (80, 80)
        assert meta['classes'][0] == 'person'
        assert meta['num_images'] > 0
    classes = meta['classes']
    e_t = priors['coco2017_train']
    # the paper: P(person | baseball glove) = 99.0 % on train2017
    assert e_t[classes.index('person'),
               classes.index('baseball glove')] == pytest.approx(0.99,
                                                                 abs=5e-3)
    # the paper: MAE(E_v, E_t) = 0.008
    assert np.abs(priors['coco2017_val'] - e_t).mean() == pytest.approx(
        0.008, abs=5e-4)
    with pytest.raises(ValueError, match='no shipped prior'):
        default_prior_path('nope')


def test_reorder_tolerates_underscores_and_case(tmp_path, prior):
    """mmdet's fallback COCO names use underscores (traffic_light)."""
    names = ['person', 'traffic light', 'Stop Sign']
    path = str(tmp_path / 'p.json')
    save_prior(path, prior, names)
    wanted = ['stop_sign', 'person', 'traffic_light']
    loaded = load_prior(path, classes=wanted)
    order = [2, 0, 1]
    np.testing.assert_array_equal(loaded, prior[np.ix_(order, order)])
    with pytest.raises(ValueError, match="'traffic_lite' is not in"):
        load_prior(path, classes=['stop_sign', 'person', 'traffic_lite'])


NOT_NUMBERS = [
    ('{"matrix": [["1", "0.5"], ["0.5", "1"]]}',
     "got the string '1' at [0, 0] (values must be numbers)"),
    ('{"matrix": [[1, "0.5"], [0.5, 1]]}',
     "got the string '0.5' at [0, 1] (values must be numbers)"),
    ('{"matrix": [[true, false], [false, true]]}',
     'got the boolean True at [0, 0] (values must be numbers)'),
    ('{"matrix": [[1, 0], [true, 1]]}',
     'got the boolean True at [1, 0] (values must be numbers)'),
]


@pytest.mark.parametrize('content, message', NOT_NUMBERS)
def test_strings_and_booleans_are_not_numbers(tmp_path, content, message):
    path = tmp_path / 'p.json'
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_prior(str(path))
    assert str(info.value) == \
        f'{path}: prior must be a numeric K x K matrix: {message}'


@pytest.mark.parametrize('array, message', [
    (np.array([['1', '0'], ['0', '1']]), 'got strings'),
    (np.eye(2, dtype=bool), 'got booleans (bool)'),
    (np.eye(2).astype('datetime64[s]'), 'got dates (datetime64[s])'),
    (np.eye(2).astype('timedelta64[s]'), 'got time spans (timedelta64[s])'),
])
def test_npy_of_strings_booleans_and_dates(tmp_path, array, message):
    path = tmp_path / 'p.npy'
    np.save(path, array)
    with pytest.raises(ValueError) as info:
        load_prior(str(path))
    assert str(info.value).startswith(
        f'{path}: prior must be a numeric K x K matrix: {message}')


def test_masked_sparse_meta_and_half_precision_tensors():
    torch = pytest.importorskip('torch')
    masked = np.ma.masked_array(np.eye(2), mask=[[0, 1], [0, 0]])
    for matrix, message in [
        (masked, 'prior must be a numeric K x K matrix, got a masked array '
         '(fill its masked values first)'),
        (torch.eye(2).to_sparse(), 'prior must be a dense tensor, got layout '
         'torch.sparse_coo (call .to_dense() first)'),
        (torch.empty(2, 2, device='meta'),
         'prior is a meta tensor (it holds no values)'),
        (torch.eye(2, dtype=torch.bool), 'prior must be a numeric K x K '
         'matrix: got booleans (bool); values must be numbers'),
    ]:
        with pytest.raises(ValueError) as info:
            validate_prior(matrix)
        assert str(info.value) == message
    # bfloat16 / float16 are numbers numpy cannot hold: widened
    half = torch.tensor([[1.0, 0.25], [0.5, 1.0]], dtype=torch.bfloat16)
    np.testing.assert_array_equal(
        validate_prior(half), [[1.0, 0.25], [0.5, 1.0]])
    np.testing.assert_array_equal(
        validate_prior(half.half()), [[1.0, 0.25], [0.5, 1.0]])


def test_a_huge_prior_is_refused_before_it_is_parsed(tmp_path, monkeypatch,
                                                     prior):
    big = batch_prior(12, [[0, 1], [2, 3, 11]])
    path = save_prior(tmp_path / 'big.json', big,
                      [f'c{k}' for k in range(12)])
    npy = save_prior(tmp_path / 'big.npy', big)
    # small limits stand in for a K = 5700 file read for a K = 80 model
    monkeypatch.setattr('mmcalidet.priors.prior_io.PRIOR_FILE_SLACK_BYTES',
                        100)
    parsed = []
    monkeypatch.setattr('mmcalidet.priors.prior_io.load_json',
                        lambda *args: parsed.append(args))
    size = os.path.getsize(path)
    with pytest.raises(ValueError) as info:
        load_prior(path, num_classes=3)
    assert str(info.value) == (f'prior file is too large for K=3 classes '
                               f'({size} bytes > limit 676): {path}')
    with pytest.raises(ValueError, match='too large for K=3 classes'):
        load_prior(path, classes=CLASSES)
    assert not parsed
    # .npy: the shape in its header is checked before the data is read
    monkeypatch.setattr(np, 'load', lambda *args, **kwargs: parsed.append(1))
    with pytest.raises(ValueError) as info:
        load_prior(npy, num_classes=11)
    assert str(info.value) == f'{npy}: prior has K=12 classes, expected 11'
    assert not parsed
    monkeypatch.undo()
    assert load_prior(npy, num_classes=12).shape == (12, 12)


def test_class_lists_are_capped(monkeypatch):
    from mmcalidet.priors import checks
    monkeypatch.setattr(checks, 'MAX_CLASSES', 5)
    with pytest.raises(ValueError) as info:
        checks.check_class_names([f'c{k}' for k in range(6)],
                                 'classes file x.txt')
    assert str(info.value) == ('classes file x.txt: 6 class names, more '
                               'than the limit of 5')
    with pytest.raises(ValueError, match='6 rows, more than the limit of 5'):
        validate_prior(np.eye(6).tolist())
    assert len(checks.check_class_names(list('abcde'))) == 5
