# Copyright (c) mmcalidet contributors. All rights reserved.
"""The progress bar of the library's long steps (caching, scoring, the
evaluation loops)."""
from typing import Iterable, Optional


def progress_bar(iterable: Optional[Iterable] = None,
                 *,
                 desc: str,
                 enabled: bool,
                 total: Optional[int] = None,
                 unit: str = 'it',
                 leave: bool = False):
    """A tqdm bar that follows the terminal's width.

    Args:
        iterable (Iterable, optional): what to iterate over (``None``: a
            bar advanced with ``update``).
        desc (str): the label.
        enabled (bool): ``False`` shows nothing.
        total (int, optional): the number of steps (default
            ``len(iterable)`` where it has one).
        unit (str): the unit of a step.
        leave (bool): keep the finished bar on screen (nested steps
            remove theirs).

    Returns:
        tqdm: the bar (a context manager).
    """
    from tqdm import tqdm
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        disable=not enabled,
        leave=leave,
        dynamic_ncols=True)
