# Copyright (c) mmcalidet contributors. All rights reserved.
"""The level of mmengine's current logger: raised to quiet it, lowered to
read it, for a block or (for a tool) for the rest of the process. mmengine
is imported when these are called, so ``mmcalidet.utils`` stays light."""
import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator, Optional, TextIO


def _current_logger() -> logging.Logger:
    from mmengine.logging import MMLogger
    return MMLogger.get_current_instance()


def _bounded(level: int, at_least: Optional[int],
             at_most: Optional[int]) -> int:
    if at_least is not None:
        level = max(level, at_least)
    if at_most is not None:
        level = min(level, at_most)
    return level


def quiet_mmengine() -> None:
    """Keep mmengine's INFO logs (weight loading, init) off the console for
    the rest of the process; a logger already quieter stays so. For tools:
    the library quiets a block only (:func:`mmengine_log_level`)."""
    logger = _current_logger()
    logger.setLevel(
        _bounded(logger.getEffectiveLevel(), logging.WARNING, None))


@contextlib.contextmanager
def mmengine_log_level(
        at_least: Optional[int] = None,
        at_most: Optional[int] = None) -> Iterator[logging.Logger]:
    """Bound the level of mmengine's current logger inside the block, and
    restore the level it had after it.

    ``at_least=logging.WARNING`` quiets INFO reports without making a
    logger left at ERROR louder; ``at_most=logging.INFO`` lets INFO
    through whatever level an earlier caller left.

    Args:
        at_least (int, optional): the lowest level inside the block.
        at_most (int, optional): the highest level inside the block.

    Yields:
        logging.Logger: the logger.
    """
    logger = _current_logger()
    level = logger.level
    logger.setLevel(_bounded(logger.getEffectiveLevel(), at_least, at_most))
    try:
        yield logger
    finally:
        logger.setLevel(level)


def log_to_file(path: str) -> str:
    """For a tool: from now on, mmengine's log records and Python's
    warnings go to the file ``path`` (appended) instead of the console, so
    that the console keeps the tool's own progress and results.

    Args:
        path (str): the log file (its folder must exist).

    Returns:
        str: ``path``.
    """
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter('%(asctime)s - %(name)s - %(levelname)s - '
                          '%(message)s'))
    logger = _current_logger()
    for old in list(logger.handlers):
        if not isinstance(old, logging.FileHandler):
            logger.removeHandler(old)
    logger.addHandler(handler)
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger('py.warnings')
    warnings_logger.handlers = [handler]
    warnings_logger.propagate = False
    return path


@contextlib.contextmanager
def library_output_to(path: str) -> Iterator[TextIO]:
    """Inside the block, what libraries print (pycocotools' index lines,
    mmengine's checkpoint lines) and Python's warnings are appended to the
    file ``path`` instead of the console. Everything is restored after the
    block, so a tool can scope it to the slow, chatty part of its run.

    Args:
        path (str): the log file (its folder is made if missing).

    Yields:
        TextIO: the console's stream (``sys.stdout`` before the block), for
        the lines the tool itself wants seen (stage lines).
    """
    console = sys.stdout
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)

    def to_log(message, category, filename, lineno, file=None, line=None):
        log.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        log.flush()

    with open(path, 'a') as log, warnings.catch_warnings(), \
            contextlib.redirect_stdout(log):
        warnings.showwarning = to_log
        yield console
