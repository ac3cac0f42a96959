# Copyright (c) mmcalidet contributors. All rights reserved.
"""Dependency versions: hard limits raise, untested versions warn.

Upper bounds asserted in code go stale, so only the ranges mmdet itself
requires are errors; the exact stack tested together (requirements/) is a
warning when it differs.
"""
import warnings
from importlib import metadata

#: the stack tested together (requirements/runtime.txt)
TESTED = {
    'torch': '2.13.0',
    'mmengine': '0.10.7',
    'mmcv': '2.1.0',
    'mmdet': '3.3.0',
}

#: hard ranges: (minimum inclusive, maximum exclusive)
REQUIRED = {
    'mmcv': ((2, 0, 0), (2, 2, 0)),
    'mmdet': ((3, 0, 0), (4, 0, 0)),
    'mmengine': ((0, 7, 1), (1, 0, 0)),
}


def _version_tuple(version: str) -> tuple:
    parts = []
    for piece in version.split('+')[0].split('.')[:3]:
        digits = ''.join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def check_dependency_versions() -> None:
    """Check mmcv/mmdet/mmengine/torch versions.

    Raises:
        ImportError: if a dependency is missing or outside the range mmdet
            3.x supports.
    """
    for name, tested in TESTED.items():
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError as exc:
            raise ImportError(
                f'mmcalidet needs {name} (tested with {name}=={tested}); '
                'run tools/setup_env.sh') from exc
        if name in REQUIRED:
            low, high = REQUIRED[name]
            if not low <= _version_tuple(found) < high:
                raise ImportError(
                    f'{name}=={found} is not supported: mmcalidet needs '
                    f'{name}>={".".join(map(str, low))},'
                    f'<{".".join(map(str, high))}')
        if found.split('+')[0] != tested:
            warnings.warn(
                f'mmcalidet is tested with {name}=={tested}, found {found}',
                stacklevel=2)
