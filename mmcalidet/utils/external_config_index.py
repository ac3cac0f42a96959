# Copyright (c) mmcalidet contributors. All rights reserved.
"""Read an installed package's model index once per process.

mmengine resolves each ``mmdet::`` base of a config by reading mmdet's
``.mim/model-index.yml`` and every metafile it lists (about 100 YAML files,
0.1-0.2 s), and falls back to the plain base path when the base has no
metafile entry (``mmengine.config.utils._get_cfg_metainfo``). A config
with a few ``mmdet::`` bases, or a process that parses many configs (the
tests, a benchmark), reads the same files again for every base.
:func:`cache_external_config_index` makes those reads of ``.mim`` YAML
files come from a per-process cache; what mmengine resolves is unchanged.
"""
import functools
import os.path as osp
from typing import Any, Callable

#: mmengine's own loader, kept to read files outside the cache
_LOAD: Callable[..., Any] = None  # type: ignore[assignment]


@functools.lru_cache(maxsize=None)
def _load_index_file(path: str, mtime: float) -> Any:
    """One ``.mim`` YAML file, read once per (path, modification time)."""
    return _LOAD(path)


def _cached_load(file, *args, **kwargs) -> Any:
    """mmengine's ``load`` for ``mmengine.config.utils``: a package's
    ``.mim`` YAML index and metafiles from the cache, anything else as
    mmengine reads it."""
    if isinstance(file, str) and not args and not kwargs and \
            f'{osp.sep}.mim{osp.sep}' in file and \
            file.endswith(('.yml', '.yaml')) and osp.isfile(file):
        return _load_index_file(file, osp.getmtime(file))
    return _LOAD(file, *args, **kwargs)


def cache_external_config_index() -> None:
    """Serve mmengine's reads of installed packages' model indexes and
    metafiles (``.mim/*.yml``) from a per-process cache (idempotent). A
    file that changes on disk is read again."""
    global _LOAD
    from mmengine.config import utils as config_utils
    if config_utils.load is _cached_load:
        return
    _LOAD = config_utils.load
    config_utils.load = _cached_load
