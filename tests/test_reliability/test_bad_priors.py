# Copyright (c) mmcalidet contributors. All rights reserved.
"""Hostile and broken priors where users give them: a detector's
``set_prior``, the detector's and the EdgeSampler's ``prior`` in a config.

``tests/test_priors/test_prior_io.py`` checks ``load_prior`` /
``validate_prior`` themselves; here every bad prior goes through the
model, with the exact error a user sees, and must leave the model's prior
as it was.
"""
import importlib.util
import os
import os.path as osp
import runpy
import signal
import sys
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.runner import load_checkpoint, save_checkpoint

from mmcalidet.models import EdgeSampler
from mmcalidet.priors import default_prior_path, load_prior, save_prior
from mmcalidet.utils.checkpoint_compat import InvalidCheckpointPriorError
from testing import PROJECT_ROOT, data_root, get_config

K = 80
register_all_modules()
_, META = load_prior(default_prior_path('coco2017_train'), return_meta=True)
CLASSES = META['classes']


@pytest.fixture(scope='module')
def model():
    cfg = get_config('calidet/calidet_deformable-detr_tiny_coco-mini.py')
    torch.manual_seed(0)
    detector = MODELS.build(cfg.model)
    detector.init_weights()  # mmdet's level_embed starts uninitialised
    detector.dataset_meta = dict(classes=CLASSES)
    return detector


def good_prior(seed=0):
    rng = np.random.default_rng(seed)
    prior = rng.uniform(size=(K, K))
    np.fill_diagonal(prior, 1.0)
    return prior


def with_value(value, at=(2, 5)):
    prior = good_prior()
    prior[at] = value
    return prior


@contextmanager
def deadline(seconds):
    """Fail instead of hanging (e.g. on reading a FIFO or /dev/zero)."""

    def fail(*args):
        raise TimeoutError(f'no answer within {seconds} s')

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def assert_refused(model, prior, message, exact=True):
    """``set_prior`` raises ``message`` (the whole text, or its start) and
    leaves the deployment prior as it was."""
    before = model.get_prior()
    with deadline(10), pytest.raises(ValueError) as info:
        model.set_prior(prior)
    text = str(info.value)
    assert (text == message) if exact else text.startswith(message), text
    np.testing.assert_array_equal(model.get_prior(), before)


def write(path, text):
    path.write_text(text)
    return str(path)


def json_prior(path, classes, matrix=None):
    matrix = good_prior() if matrix is None else matrix
    return save_prior(str(path), matrix, classes=classes)


MATRICES = [
    (np.ones((K, K - 1)),
     'prior: prior must be a square K x K matrix, got shape (80, 79)'),
    (np.ones((2, K, K)),
     'prior: prior must be a square K x K matrix, got shape (2, 80, 80)'),
    (np.eye(3), 'prior: prior has K=3 classes, expected 80'),
    (with_value(np.nan), 'prior: prior has a non-finite value nan at [2, 5]'),
    (with_value(np.inf), 'prior: prior has a non-finite value inf at [2, 5]'),
    (with_value(-np.inf),
     'prior: prior has a non-finite value -inf at [2, 5]'),
    (with_value(-0.2),
     'prior: prior values must lie in [0, 1], got -0.2 at [2, 5]'),
    (with_value(1.5),
     'prior: prior values must lie in [0, 1], got 1.5 at [2, 5]'),
    (with_value(0.9, at=(7, 7)),
     'prior: prior diagonal must be 1 (P(i | i) = 1), got 0.9 at [7, 7] '
     '(pass reset_diagonal=True to set it)'),
    ([['a'] * K] * K, 'prior: prior must be a numeric K x K matrix: got '
     "the string 'a' at [0, 0] (values must be numbers)"),
    (np.zeros((0, 0)), 'prior: prior is empty (K = 0)'),
]


@pytest.mark.parametrize('matrix, message', MATRICES)
def test_bad_matrices(model, matrix, message):
    assert_refused(model, matrix, message)
    # a torch tensor is checked the same way
    if np.asarray(matrix).dtype.kind == 'f':
        assert_refused(model, torch.as_tensor(np.asarray(matrix)), message)


def test_bad_class_names(model, tmp_path):
    # one of the model's classes is not in the file
    typo = ['persn'] + CLASSES[1:]
    path = json_prior(tmp_path / 'typo.json', typo)
    assert_refused(
        model, path, f"{path}: class 'person' is not in the prior file "
        "(did you mean 'persn', 'spoon'?)")
    # the file misses a class of the model
    path = json_prior(tmp_path / 'missing.json', CLASSES[:-1],
                      good_prior()[:-1, :-1])
    assert_refused(model, path,
                   f"{path}: class 'toothbrush' is not in the prior file")
    # the file has a class the model does not know
    path = json_prior(tmp_path / 'unknown.json', CLASSES + ['unicorn'],
                      np.eye(K + 1))
    assert_refused(
        model, path, f"{path}: prior file class 'unicorn' is missing from "
        'the given classes (80 given, 81 in the file)')
    # a class named twice
    path = write(
        tmp_path / 'duplicated.json',
        '{"classes": ["a", "b", "a"], "matrix": [[1, 0, 0], [0, 1, 0], '
        '[0, 0, 1]]}')
    assert_refused(model, path,
                   f'{path}: "classes": duplicated class name \'a\'')
    # names that are not strings, or not a list
    path = write(tmp_path / 'ints.json',
                 '{"classes": [1, 2], "matrix": [[1, 0], [0, 1]]}')
    assert_refused(
        model, path,
        f'{path}: "classes": class names must be non-empty strings, got 1')
    path = write(tmp_path / 'str.json',
                 '{"classes": "ab", "matrix": [[1, 0], [0, 1]]}')
    assert_refused(
        model, path,
        f'{path}: "classes" must be a list of class names, got str')


def test_bad_files(model, tmp_path):
    path = write(tmp_path / 'empty.json', '')
    assert_refused(model, path, f'prior file is empty: {path}')
    path = write(tmp_path / 'cut.json', '{"classes": ["a"], "matrix": [[1')
    assert_refused(
        model,
        path,
        f'prior file {path} is not valid JSON: Expecting',
        exact=False)
    path = write(tmp_path / 'list.json', '[[1, 0], [0, 1]]')
    assert_refused(
        model, path, f'{path}: a prior file must hold a JSON object '
        '{"classes": [...], "matrix": [[...]]}, got list')
    path = write(tmp_path / 'nomatrix.json', '{"classes": ["a", "b"]}')
    assert_refused(model, path, f'{path}: no "matrix" key')
    # a matrix given as a string, in a file
    path = write(tmp_path / 'string.json',
                 '{"classes": ["a", "b"], "matrix": "[[1, 0], [0, 1]]"}')
    assert_refused(model, path,
                   f'{path}: "matrix" must be a list of rows, got a string')
    path = write(tmp_path / 'ragged.json',
                 '{"classes": ["a", "b"], "matrix": [[1, 0], [0]]}')
    assert_refused(
        model,
        path,
        f'{path}: prior must be a numeric K x K matrix: setting an array '
        'element with a sequence.',
        exact=False)
    # JSON's NaN, overflowing numbers and null all end up non-finite
    for name, value, shown in (('nan', 'NaN', 'nan'), ('big', '1e999', 'inf'),
                               ('null', 'null', 'nan')):
        path = write(
            tmp_path / f'{name}.json',
            '{"classes": ["a", "b"], "matrix": [[1, %s], [0, 1]]}' % value)
        assert_refused(
            model, path,
            f'{path}: prior has a non-finite value {shown} at [0, 1]')
    path = tmp_path / 'binary.json'
    path.write_bytes(b'\xff\xfe\x00garbage')
    assert_refused(
        model,
        str(path),
        f'prior file {path} is not valid JSON: \'utf-8\' codec can\'t '
        'decode byte 0xff',
        exact=False)
    np.save(tmp_path / 'object.npy', np.full((K, K), None, dtype=object))
    assert_refused(
        model, str(tmp_path / 'object.npy'),
        f'cannot read prior file {tmp_path / "object.npy"}: Object arrays '
        'cannot be loaded when allow_pickle=False')
    path = tmp_path / 'garbage.npy'
    path.write_bytes(b'\x93NUMPY garbage')
    assert_refused(
        model, str(path), f'cannot read prior file {path}: ', exact=False)
    assert_refused(model, str(tmp_path / 'absent.json'),
                   f'prior file not found: {tmp_path / "absent.json"}')
    assert_refused(
        model, 'coco2017', "no shipped prior 'coco2017'; shipped: "
        "['coco2017_train', 'coco2017_val']")


def test_device_fifo_folder_and_huge_files_are_refused_at_once(
        model, tmp_path):
    for name, target in (('zero.json', '/dev/zero'), ('zero.npy', '/dev/zero'),
                         ('random.json', '/dev/urandom')):
        os.symlink(target, tmp_path / name)
        assert_refused(model, str(tmp_path / name),
                       f'prior file is not a regular file: {tmp_path/name}')
    os.mkfifo(tmp_path / 'fifo.json')  # opening it would block forever
    assert_refused(model, str(tmp_path / 'fifo.json'),
                   f'prior file is not a regular file: {tmp_path}/fifo.json')
    os.mkdir(tmp_path / 'folder.json')
    assert_refused(
        model, str(tmp_path / 'folder.json'),
        f'prior file is not a regular file: {tmp_path}/folder.json')
    huge = tmp_path / 'huge.json'
    with open(huge, 'wb') as f:
        f.truncate(5 * 1024**3)  # 5 GiB, sparse: no disk used
    os.symlink(huge, tmp_path / 'link.json')
    start = time.monotonic()
    for path in (huge, tmp_path / 'link.json'):
        assert_refused(
            model, str(path), f'prior file is too large ({5 * 1024**3} '
            f'bytes > limit {64 * 1024**2}): {path}')
    assert time.monotonic() - start < 2, 'the huge file was read'


def test_config_priors_fail_at_build_with_the_same_error(tmp_path):
    cfg = get_config('calidet/calidet_deformable-detr_tiny_coco-mini.py')
    path = write(tmp_path / 'empty.json', '')
    cfg.model.prior = path
    with pytest.raises(ValueError, match=f'prior file is empty: {path}'):
        MODELS.build(cfg.model)
    with pytest.raises(ValueError, match='prior has K=3 classes, expected 80'):
        EdgeSampler(num_classes=80, prior=np.eye(3))
    with pytest.raises(
            ValueError,
            match=r'prior diagonal must be 1 \(P\(i \| i\) = 1\), got 0.9'):
        EdgeSampler(num_classes=K, prior=with_value(0.9, at=(7, 7)))


CHECKPOINT_PRIORS = [
    (with_value(np.nan), 'prior has a non-finite value nan at [2, 5]'),
    (with_value(-np.inf), 'prior has a non-finite value -inf at [2, 5]'),
    (with_value(1.5), 'prior values must lie in [0, 1], got 1.5 at [2, 5]'),
    (with_value(-0.25),
     'prior values must lie in [0, 1], got -0.25 at [2, 5]'),
    (with_value(0.5, at=(7, 7)),
     'prior diagonal must be 1 (P(i | i) = 1), got 0.5 at [7, 7] (pass '
     'reset_diagonal=True to set it)'),
]


@pytest.mark.parametrize('matrix, message', CHECKPOINT_PRIORS)
def test_a_checkpoint_with_a_bad_prior_is_refused(model, tmp_path, matrix,
                                                  message):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state['prior'] = torch.from_numpy(matrix).float()
    weight = next(k for k in state if k.endswith('cls_branches.0.weight'))
    state[weight] += 1  # refused before any tensor is loaded
    before = {k: v.clone() for k, v in model.state_dict().items()}
    full = ("checkpoint has an invalid prior ('prior' of "
            f'CaliDeformableDETR): {message}')
    with pytest.raises(InvalidCheckpointPriorError) as info:
        model.load_state_dict(state)
    assert str(info.value) == full
    # mmengine's non-strict loader (the runner's, init_detector's) too,
    # where a bad tensor would otherwise only be logged
    path = str(tmp_path / 'bad_prior.pth')
    save_checkpoint(dict(state_dict=state), path)
    with pytest.raises(InvalidCheckpointPriorError) as info:
        load_checkpoint(model, path, map_location='cpu')
    assert str(info.value) == full
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_checkpoint_prior_in_float32_loads(model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state['prior'] = torch.from_numpy(good_prior(3)).float()
    before = model.get_prior()
    model.load_state_dict(state)
    try:
        np.testing.assert_array_equal(model.get_prior(),
                                      state['prior'].double().numpy())
    finally:
        model.set_prior(before)


@pytest.mark.slow
def test_test_tool_stops_with_the_error(model, tmp_path, monkeypatch):
    checkpoint = str(tmp_path / 'tiny.pth')
    save_checkpoint(dict(state_dict=model.state_dict()), checkpoint)
    prior = write(tmp_path / 'empty.json', '')
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    monkeypatch.setattr(sys, 'argv', [
        'tools/test.py', 'configs/calidet/'
        'calidet_deformable-detr_tiny_coco-mini.py', checkpoint, '--work-dir',
        str(tmp_path / 'work'), '--prior', prior
    ])
    spec = importlib.util.spec_from_file_location(
        'test_tool', osp.join(PROJECT_ROOT, 'tools', 'test.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with pytest.raises(SystemExit) as info:
        tool.main()
    assert str(info.value) == \
        f'test.py: error: --prior: prior file is empty: {prior}'


def bad_config_priors(tmp_path):
    """(prior file, the message) of priors that a training config must
    refuse: another K, a misspelled class name, NaN."""
    names = save_prior(tmp_path / 'typo.json', good_prior(),
                       ['persn'] + CLASSES[1:])
    k3 = str(tmp_path / 'k3.npy')
    np.save(k3, np.eye(3))
    nan = str(tmp_path / 'nan.npy')
    np.save(nan, with_value(np.nan))
    return [(k3, f'{k3}: prior has K=3 classes, expected 80'),
            (names, f"{names}: class 'person' is not in the prior file "
             "(did you mean 'persn'"),
            (nan, f'{nan}: prior has a non-finite value nan at [2, 5]')]


def test_train_tool_stops_with_one_line_at_a_bad_config_prior(
        tmp_path, monkeypatch, capsys):
    """A bad ``model.prior`` gave tools/train.py a traceback (at the model's
    build, or at the first step for class names): one line, before
    anything is built."""
    from mmcalidet.utils.cli import run_tool
    monkeypatch.chdir(PROJECT_ROOT)
    monkeypatch.setenv('MMCALIDET_DATA', data_root())
    monkeypatch.setattr(sys, 'argv', ['tools/train.py'])
    train = runpy.run_path(
        osp.join(PROJECT_ROOT, 'tools', 'train.py'), run_name='tool')
    for path, message in bad_config_priors(tmp_path):
        work_dir = tmp_path / 'work'
        with pytest.raises(SystemExit) as info:
            run_tool(
                train['main'], [
                    'configs/calidet/calidet_dino_tiny_coco-mini.py',
                    '--work-dir',
                    str(work_dir), '--cfg-options', f'model.prior={path}'
                ],
                errors=train['ERRORS'])
        assert info.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(
            f'train.py: error: model.prior: {message}'), err
        assert 'Traceback' not in '\n'.join(err)
        assert not work_dir.exists()  # stopped before the runner


# Known gaps, in mmcalidet/priors/prior_io.py and
# mmcalidet/priors/prior_source.py (strict: the marks go when fixed).
def test_deeply_nested_json_is_a_value_error(model, tmp_path):
    path = write(tmp_path / 'deep.json',
                 '{"matrix": ' + '[' * 100000 + ']' * 100000 + '}')
    assert_refused(
        model, path, f'prior file {path} is not valid JSON', exact=False)


def test_complex_matrix_is_refused(model):
    assert_refused(model, good_prior() * (1 + 1j),
                   'prior: prior must be a numeric K x K matrix: got complex',
                   exact=False)


def test_a_matrix_given_as_a_string_says_so(model):
    assert_refused(model, str(good_prior().tolist()),
                   'prior: got a string that looks like a matrix', exact=False)
