# Copyright (c) mmcalidet contributors. All rights reserved.
"""Shared entry-point wrapper for the command-line tools."""
import os.path as osp
import sys
from typing import Callable, Optional, Sequence, Tuple, Type

ErrorTypes = Tuple[Type[BaseException], ...]


def tool_name() -> str:
    """The running tool's name as argparse writes it in its own errors
    (``train.py``), so that every error of a tool starts alike."""
    return osp.basename(sys.argv[0]) or 'mmcalidet'


def error_line(message) -> str:
    """``<tool>: error: <message>``, the one line every error of a tool
    prints (:func:`run_tool`, :func:`tool_error`)."""
    return f'{tool_name()}: error: {message}'


def tool_error(message: str) -> SystemExit:
    """``<tool>: error: <message>``, raised to end a tool with status 1
    where no exception of :func:`run_tool`'s would carry the message.

    Args:
        message (str): what went wrong, naming the option or file.

    Returns:
        SystemExit: to raise.
    """
    return SystemExit(error_line(message))


def run_tool(main: Callable[[Optional[Sequence[str]]], Optional[int]],
             argv: Optional[Sequence[str]] = None,
             errors: ErrorTypes = (ValueError, OSError)) -> None:
    """Run a tool's ``main`` and turn bad-input errors into one line.

    A ``ValueError``/``OSError`` raised by ``main`` is printed as
    ``<tool>: error: <message>`` on stderr (``<tool>`` as argparse names it,
    e.g. ``train.py``) and the process exits with 1
    (argparse's own usage errors exit with 2), so scripts can rely on the
    exit status and users get a message that names the problem, not a
    traceback.

    Args:
        main (callable): the tool's main function taking ``argv``.
        argv (Sequence[str], optional): arguments (default ``sys.argv``).
        errors (tuple[type]): the exceptions reported in one line. Tools
            that run long jobs (``tools/train.py``) narrow them to bad
            input (e.g. ``CheckpointError``) so that other errors keep
            their traceback.
    """
    try:
        code = main(argv)
    except errors as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f'{tool_name()}: interrupted', file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def unit_float(value: str) -> float:
    """An argparse type: a finite number in [0, 1] (a score threshold, a
    probability), refused at the parser otherwise.

    Args:
        value (str): the option's text.

    Returns:
        float: the number.

    Raises:
        argparse.ArgumentTypeError: not a number in [0, 1] (NaN included).
    """
    import argparse
    try:
        number = float(value)
    except ValueError:
        number = float('nan')
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(
            f'a number in [0, 1], got {value!r}')
    return number
