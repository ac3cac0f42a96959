# Copyright (c) mmcalidet contributors. All rights reserved.
"""One yapf pass per config text in a process.

mmengine formats a config's text with yapf each time it asks for
``Config.pretty_text``: when the runner logs its environment, when it and
the visualizer dump the config, when the runtime hook records it and at
every checkpoint. On a tiny model that is about 1.3 s a call on a CPU, half
of a short training run's time. The formatting is a pure function of the
text and the style, so :func:`cache_config_formatting` remembers its
results: the config text each of these writes is the same as before.
"""
import functools
from typing import Any, Callable, Tuple


def cache_config_formatting(maxsize: int = 8) -> Callable:
    """Make ``mmengine.config.config``'s yapf call remember its last
    ``maxsize`` results (idempotent: a second call changes nothing).

    Args:
        maxsize (int): the config texts remembered.

    Returns:
        callable: the formatter mmengine now calls.

    Raises:
        ValueError: ``maxsize`` is not an integer >= 1.
    """
    from mmengine.config import config as config_module

    from .validation import check_int
    maxsize = check_int('maxsize', maxsize, 1)
    format_code = config_module.FormatCode
    if getattr(format_code, '_mmcalidet_cached', False):
        return format_code

    @functools.lru_cache(maxsize=maxsize)
    def formatted(text: str, style: Tuple, kwargs: Tuple) -> Any:
        return format_code(text, style_config=dict(style), **dict(kwargs))

    @functools.wraps(format_code)
    def cached(text: str, style_config: Any = None, **kwargs) -> Any:
        if not isinstance(style_config, dict):  # a style name or file
            return format_code(text, style_config=style_config, **kwargs)
        try:
            return formatted(text, tuple(sorted(style_config.items())),
                             tuple(sorted(kwargs.items())))
        except TypeError:  # an unhashable style value
            return format_code(text, style_config=style_config, **kwargs)

    cached._mmcalidet_cached = True
    cached.uncached = format_code
    config_module.FormatCode = cached
    return cached
