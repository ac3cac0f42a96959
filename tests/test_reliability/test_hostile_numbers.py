# Copyright (c) mmcalidet contributors. All rights reserved.
"""Numbers that would make a tool run on and print a wrong result (NaN
tolerances and step sizes, zero counts, negative decimals) are refused at
the parser, in one argparse line naming the option."""
import argparse
import math
import os.path as osp
import runpy

import pytest

from mmcalidet.utils.cli import (bounded_int, finite_float, non_negative_int,
                                 positive_int, unit_float)
from testing import PROJECT_ROOT

CALI = 'configs/calidet/calidet_dino_tiny_coco-mini.py'


def parser_of(name: str):
    """A tool's ``parse_args`` (loaded without running it)."""
    path = osp.join(PROJECT_ROOT, 'tools', 'analysis_tools', f'{name}.py')
    return runpy.run_path(path, run_name='tool')['parse_args']


def refused(parse_args, argv, option, capsys) -> str:
    """Parse ``argv``, expect argparse's usage error (status 2) naming
    ``option``, and return that line."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f'error: argument {option}: ' in last, last
    return last


def test_finite_float_and_bounded_int():
    positive = finite_float(0, low_open=True)
    assert positive('0.5') == 0.5 and positive('1e3') == 1000.0
    for text in ('nan', 'inf', '-inf', '0', '-1', 'x', ''):
        with pytest.raises(argparse.ArgumentTypeError, match='> 0'):
            positive(text)
    assert finite_float()('-2.5') == -2.5
    with pytest.raises(argparse.ArgumentTypeError, match='finite'):
        finite_float()('nan')
    half = finite_float(0, 1, high_open=True)
    assert half('0') == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match=r'in \[0, 1\)'):
        half('1')
    assert positive_int('3') == 3 and non_negative_int('0') == 0
    for parse, text in ((positive_int, '0'), (positive_int, '1.5'),
                        (non_negative_int, '-3'), (bounded_int(1, 5), '6'),
                        (positive_int, 'nan')):
        with pytest.raises(argparse.ArgumentTypeError, match='an integer'):
            parse(text)
    # the existing [0, 1] type keeps its behaviour
    assert unit_float('0.3') == 0.3
    assert all(not math.isnan(unit_float(v)) for v in ('0', '1'))
    with pytest.raises(argparse.ArgumentTypeError):
        unit_float('nan')


@pytest.mark.parametrize('value', ['nan', 'inf', '-1'])
def test_eval_priors_order_tol(value, capsys):
    """``--order-tol nan`` gave all-zero APs the verdict "holds"."""
    parse_args = parser_of('eval_priors')
    assert parse_args([CALI, 'none', '--order-tol', '0.1']).order_tol == 0.1
    refused(parse_args, [CALI, 'none', '--order-tol', value], '--order-tol',
            capsys)


@pytest.mark.parametrize('option,value', [('--eta', 'nan'), ('--eta', '0'),
                                          ('--eta', 'inf'), ('--tol', 'nan'),
                                          ('--tol', '-1'), ('--iters', '-1'),
                                          ('--iters', '2.5'),
                                          ('--num-images', '0'),
                                          ('--eval-interval', '0'),
                                          ('--sizes', '-8')])
def test_self_calibrate_numbers(option, value, capsys):
    """``--eta nan`` ran to "converged" and exited 0."""
    parse_args = parser_of('self_calibrate')
    args = parse_args([CALI, 'none', '--eta', '4', '--tol', '0', '--iters',
                       '0'])
    assert (args.eta, args.tol, args.iters) == (4.0, 0.0, 0)
    refused(parse_args, [CALI, 'none', option, value], option, capsys)


@pytest.mark.parametrize('option', ['--num-images', '--passes',
                                    '--batch-size'])
def test_cache_decoder_outputs_counts(option, capsys):
    """``--num-images 0`` cached every image."""
    parse_args = parser_of('cache_decoder_outputs')
    argv = [CALI, 'none', '--out', 'cache']
    assert getattr(parse_args(argv + [option, '2']),
                   option[2:].replace('-', '_')) == 2
    for value in ('0', '-1'):
        refused(parse_args, argv + [option, value], option, capsys)


def test_compute_prior_decimals(capsys):
    """``--decimals -3`` wrote a prior that load_prior then rejected (its
    diagonal rounded to 0)."""
    parse_args = parser_of('compute_prior')
    assert parse_args(['src.json', '--out', 'p.json', '--decimals',
                       '0']).decimals == 0
    assert parse_args(['src.json', '--out', 'p.json']).decimals is None
    refused(parse_args, ['src.json', '--out', 'p.json', '--decimals', '-3'],
            '--decimals', capsys)
