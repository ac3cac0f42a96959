# Copyright (c) mmcalidet contributors. All rights reserved.
"""The checks of numbers given to the library, shared by its public
functions and the tools' parsers (:mod:`mmcalidet.utils.cli` builds its
argparse types on them), so a parser and the API under it refuse the same
values with the same words.

A bad value raises a ``ValueError`` that names the argument, e.g.
``eta must be a finite number > 0, got nan``.
"""
import math
import numbers
from typing import Optional

import numpy as np


def bound_text(low: Optional[float] = None,
               high: Optional[float] = None,
               low_open: bool = False,
               high_open: bool = False) -> str:
    """``in [0, 1]``, ``> 0``, ``>= 1``, ... (empty without bounds).

    Args:
        low (float, optional): the lower bound.
        high (float, optional): the upper bound.
        low_open (bool): ``low`` itself excluded.
        high_open (bool): ``high`` itself excluded.

    Returns:
        str: the bounds in words.
    """
    if low is not None and high is not None:
        return (f'in {"(" if low_open else "["}{low:g}, '
                f'{high:g}{")" if high_open else "]"}')
    if low is not None:
        return f'{">" if low_open else ">="} {low:g}'
    if high is not None:
        return f'{"<" if high_open else "<="} {high:g}'
    return ''


def _fits(number: float, low, high, low_open, high_open) -> bool:
    return math.isfinite(number) and (
        low is None or (number > low if low_open else number >= low)) and (
            high is None or (number < high if high_open else number <= high))


def check_float(name: str,
                value,
                low: Optional[float] = None,
                high: Optional[float] = None,
                low_open: bool = False,
                high_open: bool = False,
                allow_none: bool = False) -> Optional[float]:
    """A finite real number within bounds, or a ``ValueError`` naming
    ``name``.

    Args:
        name (str): the argument's name, as the caller wrote it.
        value: the value given.
        low (float, optional): the lower bound (none if ``None``).
        high (float, optional): the upper bound (none if ``None``).
        low_open (bool): exclude ``low`` itself. Defaults to False.
        high_open (bool): exclude ``high`` itself. Defaults to False.
        allow_none (bool): ``None`` is accepted (and returned).

    Returns:
        float or None: ``value`` as a float.

    Raises:
        ValueError: not a finite number within the bounds (NaN, an
            infinity, a bool or a string included).
    """
    if value is None and allow_none:
        return None
    bounds = bound_text(low, high, low_open, high_open)
    what = ('a finite number ' + bounds).strip()
    ok = isinstance(value, (numbers.Real, np.number)) and not isinstance(
        value, (bool, np.bool_))
    if ok:
        number = float(value)
        ok = _fits(number, low, high, low_open, high_open)
    if not ok:
        extra = ' or None' if allow_none else ''
        raise ValueError(f'{name} must be {what}{extra}, got {value!r}')
    return number


def check_int(name: str,
              value,
              low: Optional[int] = None,
              high: Optional[int] = None,
              allow_none: bool = False) -> Optional[int]:
    """An integer within bounds, or a ``ValueError`` naming ``name``.

    Args:
        name (str): the argument's name.
        value: the value given (an int, or a float with an integer value
            such as ``2.0``).
        low (int, optional): the smallest value.
        high (int, optional): the largest value.
        allow_none (bool): ``None`` is accepted (and returned).

    Returns:
        int or None: ``value`` as an int.

    Raises:
        ValueError: not an integer within the bounds.
    """
    if value is None and allow_none:
        return None
    what = ('an integer ' + bound_text(low, high)).strip()
    number = None
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
            value, (bool, np.bool_)):
        number = int(value)
    elif isinstance(value, (numbers.Real, np.floating)) and not isinstance(
            value, (bool, np.bool_)) and math.isfinite(value) and float(
                value).is_integer():
        number = int(value)
    if number is None or (low is not None and number < low) or (
            high is not None and number > high):
        extra = ' or None' if allow_none else ''
        raise ValueError(f'{name} must be {what}{extra}, got {value!r}')
    return number


def check_finite_array(array, what: str) -> None:
    """Refuse an array holding NaN or an infinity, naming where it came
    from and the first bad entry.

    The check is one ``np.isfinite(...).all()`` on a contiguous array
    (a torch tensor is checked with ``torch.isfinite``, on its device).

    Args:
        array (np.ndarray | torch.Tensor): the values.
        what (str): what they are, e.g. ``"the hidden states of cache
            file /x/batch_00003.npz"``.

    Raises:
        ValueError: ``<what> holds a non-finite value (nan at index
            (0, 4))``.
    """
    if hasattr(array, 'detach'):  # a torch tensor
        import torch
        if array.is_floating_point() and not bool(
                torch.isfinite(array).all()):
            bad = (~torch.isfinite(array)).nonzero()[0].tolist()
            value = array[tuple(bad)].item()
            raise ValueError(f'{what} holds a non-finite value ({value} at '
                             f'index {tuple(bad)})')
        return
    array = np.asarray(array)
    if array.dtype.kind in 'fc' and not np.isfinite(array).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
        raise ValueError(f'{what} holds a non-finite value ({array[bad]} at '
                         f'index {bad})')


def check_device(device: Optional[str], what: str = 'device') -> None:
    """Refuse, before a model is built, a device torch cannot use: not a
    device name, CUDA on a torch without CUDA or a machine without a GPU,
    or a GPU index beyond those there are. ``None`` (the default choice)
    passes.

    Args:
        device (str, optional): e.g. ``'cpu'``, ``'cuda:0'``.
        what (str): how errors name it (e.g. ``'--device'``).

    Raises:
        ValueError: one line naming the device and the problem.
    """
    if device is None:
        return
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f'{what} {device!r} is not a device name '
                         f'({str(exc).splitlines()[0]})') from None
    if dev.type != 'cuda':
        return
    if not torch.cuda.is_available():
        why = 'this torch is built without CUDA' if \
            torch.version.cuda is None else 'no CUDA GPU is visible'
        raise ValueError(f'{what} {device!r}: {why} (use cpu)')
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f'{what} {device!r}: there are {count} CUDA '
                         f'GPU(s) (cuda:0 to cuda:{count - 1})')
