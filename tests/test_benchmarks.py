# Copyright (c) mmcalidet contributors. All rights reserved.
"""Every script in benchmarks/ imports against the package as it is now and
answers ``-h`` (the scripts themselves measure, so no test runs them in
full; docs/benchmarks.md has their commands and figures)."""
import glob
import os.path as osp
import runpy
import sys

import pytest

from testing import PROJECT_ROOT

SCRIPTS = sorted(glob.glob(osp.join(PROJECT_ROOT, 'benchmarks', '*.py')))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize('path', SCRIPTS, ids=osp.basename)
def test_benchmark_imports_and_answers_help(path, monkeypatch, capsys):
    main = runpy.run_path(path, run_name='benchmark')['main']
    monkeypatch.setattr(sys, 'argv', [path, '-h'])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0
    assert 'usage:' in capsys.readouterr().out
