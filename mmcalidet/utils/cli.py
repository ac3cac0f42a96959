# Copyright (c) mmcalidet contributors. All rights reserved.
"""Shared entry-point wrapper for the command-line tools."""
import os.path as osp
import sys
from typing import Callable, Optional, Sequence, Tuple, Type

from .validation import bound_text, check_float, check_int

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


def finite_float(low: Optional[float] = None,
                 high: Optional[float] = None,
                 low_open: bool = False,
                 high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number within bounds, refused at the
    parser otherwise (NaN and infinities included), e.g.
    ``type=finite_float(0, low_open=True)`` for a step size > 0.

    Args:
        low (float, optional): the lower bound (none if ``None``).
        high (float, optional): the upper bound (none if ``None``).
        low_open (bool): exclude ``low`` itself. Defaults to False.
        high_open (bool): exclude ``high`` itself. Defaults to False.

    Returns:
        callable: ``str -> float``, raising
        ``argparse.ArgumentTypeError`` for other text.
    """
    what = ('a finite number ' +
            bound_text(low, high, low_open, high_open)).strip()

    def parse(value: str) -> float:
        import argparse
        try:
            number = float(value)
        except ValueError:
            number = float('nan')
        try:  # the library's own check, so parser and API agree
            return check_float('value', number, low, high, low_open,
                               high_open)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f'{what}, got {value!r}') from None

    parse.__name__ = 'finite_float'
    return parse


def bounded_int(low: Optional[int] = None,
                high: Optional[int] = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, refused at the
    parser otherwise, e.g. ``type=bounded_int(1)`` for a count
    (:data:`positive_int`).

    Args:
        low (int, optional): the smallest value (none if ``None``).
        high (int, optional): the largest value (none if ``None``).

    Returns:
        callable: ``str -> int``, raising ``argparse.ArgumentTypeError``
        for other text.
    """
    what = ('an integer ' + bound_text(low, high)).strip()

    def parse(value: str) -> int:
        import argparse
        try:
            return check_int('value', int(value), low, high)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f'{what}, got {value!r}') from None

    parse.__name__ = 'bounded_int'
    return parse


#: an argparse type: an integer >= 1 (a count of images, iterations, ...)
positive_int = bounded_int(1)
#: an argparse type: an integer >= 0
non_negative_int = bounded_int(0)

#: the largest random seed (numpy's and mmengine's ``randomness.seed``
#: take 32-bit seeds)
MAX_SEED = 2**32 - 1


def seed_int(value: str) -> int:
    """An argparse type: a random seed, an integer in [0, 2**32 - 1] (what
    numpy and mmengine take), refused at the parser otherwise.

    Args:
        value (str): the option's text.

    Returns:
        int: the seed.

    Raises:
        argparse.ArgumentTypeError: not an integer in that range.
    """
    import argparse
    try:
        return check_int('value', int(value), 0, MAX_SEED)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'an integer in [0, {MAX_SEED}] (2**32 - 1), got {value!r}'
        ) from None


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
        return finite_float(0, 1)(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f'a number in [0, 1], got {value!r}') from None


def trust_radius(value: str) -> Optional[float]:
    """An argparse type: a self-calibration trust radius, a finite number
    >= 0, or ``none`` (no limit, the paper's Algo. 1).

    Args:
        value (str): the option's text.

    Returns:
        float or None: the radius; ``None`` for ``none``.

    Raises:
        argparse.ArgumentTypeError: neither ``none`` nor a number >= 0.
    """
    return None if value.strip().lower() == 'none' else finite_float(0)(value)
