# Copyright (c) mmcalidet contributors. All rights reserved.
"""mmcalidet.utils.cli: every error of a tool starts as argparse's do."""
import argparse
import sys

import pytest

from mmcalidet.utils.cli import run_tool, tool_error


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
    (['--k', '0'], 1, None),
    (['--x'], 2, 'train.py: error: the following arguments are required: '
     '--k'),
])
def test_errors_of_one_tool_share_argparse_prefix(monkeypatch, capsys, argv,
                                                  code, line):
    monkeypatch.setattr(sys, 'argv', ['tools/train.py', *argv])
    with pytest.raises(SystemExit) as info:
        run_tool(_main, argv)
    if line is None:  # tool_error: the message is the exit's
        assert info.value.code == 'train.py: error: --k: zero'
    else:
        assert info.value.code == code
        assert capsys.readouterr().err.strip().splitlines()[-1] == line


def test_success_exits_zero(monkeypatch):
    monkeypatch.setattr(sys, 'argv', ['tools/train.py'])
    with pytest.raises(SystemExit) as info:
        run_tool(_main, ['--k', '3'])
    assert info.value.code == 0
