# Copyright (c) mmcalidet contributors. All rights reserved.
"""Editing priors by class name (library and tools/misc/edit_prior.py)."""
import json

import numpy as np
import pytest

from mmcalidet.priors import batch_prior, load_prior, save_prior
from mmcalidet.priors.edit import apply_edits, parse_edit

CLASSES = ['person', 'bicycle', 'baseball glove', 'coke', 'sprite']


@pytest.fixture
def base():
    return batch_prior(5, [[0, 1], [0, 2], [3, 4], [3, 4, 0]])


def test_parse_edit():
    assert parse_edit('sprite|coke=0.0') == ('sprite', 'coke', 0.0)
    assert parse_edit(' baseball glove | person = 0.25 ') == (
        'baseball glove', 'person', 0.25)


@pytest.mark.parametrize('text, message', [
    ('sprite coke=0', 'must read'),
    ('sprite|coke', 'must read'),
    ('a|b|c=0.1', 'exactly one'),
    ('sprite|coke=high', 'not a number'),
    ('sprite|coke=1.5', r'\[0, 1\]'),
    ('sprite|coke=nan', r'\[0, 1\]'),
])
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_edit(text)


def test_apply_edits(base):
    out = apply_edits(base, CLASSES, ['sprite|coke=0.0',
                                      'person|bicycle=0.95'])
    assert out[4, 3] == 0.0 and out[0, 1] == 0.95
    mask = np.ones_like(base, dtype=bool)
    mask[4, 3] = mask[0, 1] = False
    np.testing.assert_array_equal(out[mask], base[mask])
    assert base[4, 3] == 1.0  # input untouched
    # wildcard: nothing is known about bicycles any more; diagonal stays 1
    out = apply_edits(base, CLASSES, ['*|bicycle=0.5'])
    np.testing.assert_array_equal(np.delete(out[:, 1], 1), 0.5)
    assert out[1, 1] == 1.0


def test_unknown_name_lists_close_matches(base):
    with pytest.raises(ValueError, match="unknown class 'sprit'.*'sprite'"):
        apply_edits(base, CLASSES, ['sprit|coke=0'])
    with pytest.raises(ValueError, match='always 1'):
        apply_edits(base, CLASSES, ['coke|coke=0'])


@pytest.mark.slow
def test_tool(tmp_path, base, run_tool):
    src = tmp_path / 'base.json'
    save_prior(str(src), base, CLASSES, source='unit')
    out = tmp_path / 'site.json'
    res = run_tool('tools/misc/edit_prior.py', str(src), '--set',
                   'sprite|coke=0.0', '--set', 'person|bicycle=0.95',
                   '--out', str(out))
    assert res.returncode == 0, res.stderr
    edited, meta = load_prior(str(out), return_meta=True)
    assert edited[4, 3] == 0.0 and edited[0, 1] == 0.95
    assert meta['edits'] == ['sprite|coke=0.0', 'person|bicycle=0.95']
    assert meta['source'] == 'unit'
    # an unknown class: exit 1, one line with close matches, no output
    out.write_text('keep')
    res = run_tool('tools/misc/edit_prior.py', str(src), '--set',
                   'sprte|coke=0', '--out', str(out))
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1
    assert "did you mean 'sprite'" in res.stderr
    assert out.read_text() == 'keep'
    with open(src) as f:
        assert json.load(f)['classes'] == CLASSES
