# Copyright (c) mmcalidet contributors. All rights reserved.
__version__ = '0.1.0'


def parse_version_info(version_str: str) -> tuple:
    """Parse a version string into a tuple of ints (and a suffix).

    Args:
        version_str (str): The version string, e.g. ``'0.1.0'``.

    Returns:
        tuple: e.g. ``(0, 1, 0)``.
    """
    parts = []
    for x in version_str.split('.'):
        parts.append(int(x) if x.isdigit() else x)
    return tuple(parts)


version_info = parse_version_info(__version__)
