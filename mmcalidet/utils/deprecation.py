# Copyright (c) mmcalidet contributors. All rights reserved.
"""Old names kept for one release: a ``DeprecationWarning`` naming the new
place, once per name and process.

Light (standard library only). A package serves its old names with a
module-level ``__getattr__`` (PEP 562), so only code that uses an old name
is warned, not every import of the package::

    __getattr__ = deprecated_names(__name__, {
        'OldName': ('mmcalidet.new.place', 'NewName'),
    })

The warning points at the user's line: frames of this module, of the
import machinery and of the deprecated module itself are skipped (a
``from package import old`` asks ``hasattr`` from inside importlib first).
"""
import sys
import warnings
from importlib import import_module
from typing import Callable, Dict, Iterable, Set, Tuple

#: the old names warned of in this process
_warned: Set[str] = set()

#: ``importlib.import_module``'s module (its frames are not internal below)
_MACHINERY = ('importlib', )


def _is_internal_frame(frame) -> bool:
    """A frame of the import machinery that ``warnings.warn`` skips by
    itself when it counts ``stacklevel`` (its own test)."""
    filename = frame.f_code.co_filename
    return 'importlib' in filename and '_bootstrap' in filename


def _user_stacklevel(skip: Iterable[str]) -> int:
    """``warnings.warn``'s stacklevel of the first frame outside this
    module, the import machinery and the modules named in ``skip``, for a
    call of ``warnings.warn`` made in this module's
    :func:`warn_deprecated`."""
    skipped = set(_MACHINERY) | {__name__} | set(skip)
    frame, level = sys._getframe(2), 2  # 1: warn_deprecated itself
    while frame is not None:
        if not _is_internal_frame(frame):  # those are not counted
            if frame.f_globals.get('__name__') not in skipped:
                return level
            level += 1
        frame = frame.f_back
    return 1


def warn_deprecated(old: str, new: str, skip: Iterable[str] = ()) -> None:
    """Warn once per process that ``old`` is deprecated; use ``new``.

    Args:
        old (str): the old dotted name, e.g.
            ``'mmcalidet.datasets.build_decoder_cache'``.
        new (str): the dotted name to use instead.
        skip (Iterable[str]): more module names whose frames the warning
            does not point at (the deprecated module itself).
    """
    if old in _warned:
        return
    _warned.add(old)
    warnings.warn(
        f'{old} is deprecated and will be removed in the next release; '
        f'use {new}',
        DeprecationWarning,
        stacklevel=_user_stacklevel(skip))


def deprecated_names(module: str,
                     names: Dict[str, Tuple[str, str]]) -> Callable:
    """A module-level ``__getattr__`` (PEP 562) that serves old names.

    Args:
        module (str): the module's ``__name__``.
        names (dict): old name -> (new module, new name); the new module is
            imported on first access.

    Returns:
        Callable: ``__getattr__(name)``: the new object, warning once with
        :func:`warn_deprecated`; ``AttributeError`` for other names.
    """

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(
                f'module {module!r} has no attribute {name!r}')
        new_module, new_name = names[name]
        warn_deprecated(f'{module}.{name}', f'{new_module}.{new_name}',
                        skip=(module, ))
        return getattr(import_module(new_module), new_name)

    return __getattr__
