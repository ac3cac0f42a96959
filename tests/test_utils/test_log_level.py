# Copyright (c) mmcalidet contributors. All rights reserved.
import logging
import warnings

import pytest
from mmengine.logging import MMLogger, print_log

from mmcalidet.utils.log_level import (library_output_to, mmengine_log_level,
                                       quiet_mmengine)
from testing import captured_log


@pytest.fixture
def logger():
    logger = MMLogger.get_current_instance()
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_quiet_mmengine_raises_the_level_and_never_lowers_it(logger):
    logger.setLevel(logging.INFO)
    quiet_mmengine()
    assert logger.level == logging.WARNING
    logger.setLevel(logging.ERROR)
    quiet_mmengine()
    assert logger.level == logging.ERROR


@pytest.mark.parametrize('start,bounds,inside', [
    (logging.INFO, dict(at_least=logging.WARNING), logging.WARNING),
    (logging.ERROR, dict(at_least=logging.WARNING), logging.ERROR),
    (logging.WARNING, dict(at_most=logging.INFO), logging.INFO),
    (logging.DEBUG, dict(at_most=logging.INFO), logging.DEBUG),
])
def test_mmengine_log_level_bounds_the_block_and_restores(
        logger, start, bounds, inside):
    logger.setLevel(start)
    with pytest.raises(KeyError):  # restored on the way out of an error
        with mmengine_log_level(**bounds) as inner:
            assert inner is logger and logger.level == inside
            raise KeyError
    assert logger.level == start


def test_captured_log_reads_info_after_a_tool_quieted_the_logger(logger):
    logger.setLevel(logging.INFO)
    quiet_mmengine()
    with captured_log() as lines:
        print_log('cache made', logger='current')
    print_log('after the block', logger='current')
    assert lines == ['cache made']
    assert logger.level == logging.WARNING


@pytest.mark.slow  # a Python process of its own
def test_log_to_file_keeps_logs_and_warnings_off_the_console(
        tmp_path, capsys):
    import subprocess
    import sys
    path = tmp_path / 'tool.log'
    # a process of its own: the handlers stay changed for its lifetime
    script = ('import warnings\n'
              'from mmengine.logging import MMLogger, print_log\n'
              'from mmcalidet.utils.log_level import log_to_file\n'
              'MMLogger.get_instance("t", log_level="INFO")\n'
              f'log_to_file({str(path)!r})\n'
              'print_log("a banner", logger="current")\n'
              'print_log("a warning", logger="current", level=30)\n'
              'warnings.warn("a library warning")\n'
              'print("the result")\n')
    proc = subprocess.run([sys.executable, '-c', script],
                          capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'the result'
    assert 'banner' not in proc.stderr and 'warning' not in proc.stderr
    text = path.read_text()
    for line in ('a banner', 'a warning', 'a library warning'):
        assert line in text


def test_library_output_to_keeps_prints_and_warnings_in_the_file(
        tmp_path, capsys):
    path = tmp_path / 'out' / 'eval.log'
    path.parent.mkdir()
    path.write_text('an earlier run\n')
    with pytest.raises(KeyError):  # restored on the way out of an error
        with library_output_to(str(path)) as console:
            print('creating index...')
            warnings.warn('a library warning')
            print('decoder cache: made', file=console)
            raise KeyError
    print('the result')
    out, err = capsys.readouterr()
    assert out == 'decoder cache: made\nthe result\n'
    assert 'library warning' not in err
    lines = path.read_text().splitlines()
    # appended: what was written before is kept
    assert lines[:2] == ['an earlier run', 'creating index...']
    assert 'UserWarning: a library warning' in lines[2]
    with pytest.warns(UserWarning, match='after the block'):
        warnings.warn('after the block')


def test_library_output_to_makes_the_folder(tmp_path):
    path = tmp_path / 'a' / 'b' / 'tool.log'
    with library_output_to(str(path)):
        print('index created!')
    assert path.read_text() == 'index created!\n'
