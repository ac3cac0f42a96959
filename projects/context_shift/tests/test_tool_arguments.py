# Copyright (c) mmcalidet contributors. All rights reserved.
"""The project's tools refuse bad numbers and names at the parser, before
anything is written, and honour an explicit 0 or refuse it (never replace
it by a default)."""
import json
import os.path as osp
import runpy

import pytest

from projects.context_shift.context_shift.training import schedule
from testing import PROJECT_ROOT

TOOLS = osp.join(PROJECT_ROOT, 'projects', 'context_shift', 'tools')


def tool(name):
    """A project tool's module namespace (loaded without running it)."""
    return runpy.run_path(osp.join(TOOLS, f'{name}.py'), run_name='tool')


@pytest.mark.parametrize('option,value', [('--dino-iters', '0'),
                                          ('--finetune-iters', '0'),
                                          ('--calibrator-updates', '0'),
                                          ('--self-cal-iters', '-5'),
                                          ('--decay-at', 'nan'),
                                          ('--decay-at', '0')])
def test_benchmark_numbers_are_honoured_or_refused(option, value, capsys):
    """``--dino-iters 0`` was replaced by the default (900 iterations);
    ``--self-cal-iters -5`` and ``--decay-at nan`` passed the parser."""
    parse_args = tool('benchmark')['parse_args']
    with pytest.raises(SystemExit) as exc:
        parse_args([option, value])
    assert exc.value.code == 2
    assert f'error: argument {option}: ' in capsys.readouterr().err
    args = parse_args(['--dino-iters', '12', '--calibrator-updates', '3'])
    assert schedule(args)['dino'] == 12 and schedule(args)['calidet'] == 3
    # the library's schedule refuses a 0 given to it rather than replace it
    args.dino_iters = 0
    with pytest.raises(ValueError, match='must be >= 1'):
        schedule(args)


def test_make_data_refuses_before_it_writes(tmp_path, capsys):
    """``--num-val-per-site 0`` and a site named ``x/../../y`` failed after
    writing began, left ``OUT.partial/`` and did not name the option."""
    make_data = tool('make_data')
    out = str(tmp_path / 'data')
    with pytest.raises(SystemExit) as exc:
        make_data['main'](['--out', out, '--num-val-per-site', '0'])
    assert exc.value.code == 2
    assert 'argument --num-val-per-site: an integer >= 1' in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        make_data['main'](['--out', out, '--digit-size', '22', '14'])
    assert 'argument --digit-size: MIN must not exceed MAX' in \
        capsys.readouterr().err
    scenes = tmp_path / 'scenes.json'
    scenes.write_text(json.dumps(dict(sites={'x/../../y': {}})))
    with pytest.raises(ValueError, match=r"^--scenes: site name 'x/\.\./"
                       r"\.\./y' must be"):
        make_data['main'](['--out', out, '--scenes', str(scenes)])
    assert not osp.exists(out) and not osp.exists(out + '.partial')


@pytest.mark.parametrize('option,value', [('--train-seed', '-1'),
                                          ('--train-seed', '4294967296'),
                                          ('--train-seed', 'x'),
                                          ('--seed', '-1')])
def test_benchmark_seeds_out_of_range_are_one_line(option, value, capsys):
    """``--train-seed -1`` and ``--train-seed 4294967296`` (2**32) passed
    the parser and ended in a traceback of the training's seeding."""
    parse_args = tool('benchmark')['parse_args']
    with pytest.raises(SystemExit) as exc:
        parse_args([option, value])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f'error: argument {option}: an integer in [0, 4294967295]' in \
        last, last
    # the range's ends are seeds
    for seed in ('0', '4294967295'):
        assert getattr(parse_args([option, seed]),
                       option[2:].replace('-', '_')) == int(seed)
