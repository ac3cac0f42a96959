# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet.utils.cli: every error of a tool starts as argparse's do."""
import argparse
import sys

import pytest

from mmcalidet.utils.cli import run_tool, tool_error, trust_radius


def _main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument('--k', type=int, required=True)
    args = parser.parse_args(argv)
    if args.k < 0:
        raise ValueError(f'--k must be >= 0, got {args.k}')
    if args.k == 0:
        raise tool_error('--k: zero')
    return 0


@pytest.mark.parametrize('argv,code,line', [
    (['--k', '-1'], 1, 'train.py: error: --k must be >= 0, got -1'),
    (['--x'], 2, 'train.py: error: the following arguments are required: '
     '--k'),
])
def test_errors_of_one_tool_share_argparse_prefix(monkeypatch, capsys, argv,
                                                  code, line):
    monkeypatch.setattr(sys, 'argv', ['tools/train.py', *argv])
    with pytest.raises(SystemExit) as info:
        run_tool(_main, argv)
    assert info.value.code == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


def test_tool_error_exits_with_the_same_prefix(monkeypatch):
    # a SystemExit with a message: Python prints it and exits with 1
    monkeypatch.setattr(sys, 'argv', ['tools/train.py'])
    with pytest.raises(SystemExit) as info:
        run_tool(_main, ['--k', '0'])
    assert info.value.code == 'train.py: error: --k: zero'


def test_success_exits_zero(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['tools/train.py'])
    with pytest.raises(SystemExit) as info:
        run_tool(_main, ['--k', '3'])
    assert info.value.code == 0


@pytest.mark.parametrize('text,value', [('none', None), ('None', None),
                                        ('0', 0.0), ('0.05', 0.05)])
def test_trust_radius_reads_a_radius_or_none(text, value):
    assert trust_radius(text) == value


@pytest.mark.parametrize('text', ['-0.1', 'nan', 'inf', 'wide'])
def test_trust_radius_refuses_what_is_not_a_radius(text):
    with pytest.raises(argparse.ArgumentTypeError):
        trust_radius(text)
