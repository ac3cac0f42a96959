# Copyright (c) mmcalidet contributors. All rights reserved.
"""The logging state a tool run in the test process changes."""
import contextlib
import logging
import warnings
from typing import Iterator


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Give back, after the block, the console handlers of mmengine's
    current logger and Python's warnings, which ``log_to_file`` (the
    benchmark's start) sends to a file for the rest of the process."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    warnings_logger = logging.getLogger('py.warnings')
    handlers = list(logger.handlers)
    warnings_handlers = list(warnings_logger.handlers)
    propagate = warnings_logger.propagate
    showwarning = warnings.showwarning
    try:
        yield
    finally:
        for handler in logger.handlers + warnings_logger.handlers:
            if handler not in handlers + warnings_handlers:
                handler.close()
        logger.handlers = handlers
        warnings_logger.handlers = warnings_handlers
        warnings_logger.propagate = propagate
        if warnings.showwarning is not showwarning:
            logging.captureWarnings(False)
            warnings.showwarning = showwarning
