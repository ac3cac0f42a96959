# Copyright (c) mmcalidet contributors. All rights reserved.
import logging

import pytest
from mmengine.logging import MMLogger, print_log

from mmcalidet.testing import captured_log
from mmcalidet.utils.log_level import mmengine_log_level, quiet_mmengine


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
