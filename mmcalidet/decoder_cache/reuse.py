# Copyright (c) mmcalidet contributors. All rights reserved.
"""Reusing a cache folder: the folder of a fingerprint, why a folder is not
current (missing, torn, made of something else) and the open-or-make step
every builder goes through (:func:`open_or_make`)."""
import os.path as osp
from typing import Callable, Dict, List, Optional

from mmengine.logging import print_log

from ..utils.cache_kinds import CacheError
from .fingerprint import fingerprint_changes, fingerprint_digest
from .private_folders import remove_stale_folders
from .store import DecoderCache


def cache_folder(cache_dir: str, fingerprint: Dict) -> str:
    """The folder of ``cache_dir`` that holds the cache of a fingerprint
    (``decoder_cache-<digest>``): another checkpoint, config, image set or
    batch size gets another folder."""
    return osp.join(cache_dir,
                    f'decoder_cache-{fingerprint_digest(fingerprint)}')


def _open_current(folder: str, fingerprint: Dict) -> tuple:
    """The cache of ``folder`` if complete and of ``fingerprint`` (else
    ``None``), and why not."""
    if not osp.isdir(folder):
        return None, ['no cache']
    try:
        cache = DecoderCache.open(folder)
    except CacheError as exc:
        return None, [f'{osp.basename(exc.path)} {exc.problem}']
    changes = fingerprint_changes(cache.fingerprint, fingerprint)
    return (None if changes else cache), changes


def stale_reasons(folder: str, fingerprint: Dict) -> List[str]:
    """Why ``folder`` does not hold a complete cache of ``fingerprint``.

    Args:
        folder (str): the cache folder.
        fingerprint (dict): what the cache should be made of
            (:func:`~mmcalidet.decoder_cache.cache_fingerprint`).

    Returns:
        list[str]: empty when the cache is current; else ``'no cache'``,
        ``'<file> <problem>'`` for a missing, torn or garbled file, or
        ``'KEY changed'`` for each entry of the fingerprint that differs.
    """
    return _open_current(folder, fingerprint)[1]


def _log(message: str, logger: Optional[Callable[[str], None]]) -> None:
    if logger is None:
        print_log(message, logger='current')
    else:
        logger(message)


def open_or_make(folder: str,
                 fingerprint: Dict,
                 make: Callable[[], DecoderCache],
                 force: bool = False,
                 logger: Optional[Callable[[str], None]] = None) -> tuple:
    """The cache of ``folder`` where it is complete and of ``fingerprint``,
    else the one ``make()`` returns (it writes ``folder`` through a
    :class:`DecoderCacheWriter`); a one-line message says why an existing
    folder is made again. Either way the private folders that killed
    builds left beside it (``.<name>.partial-<pid>-...`` of a process no
    longer alive, :func:`~.private_folders.remove_stale_folders`) are
    removed first, each named in a message.

    Args:
        folder (str): the cache folder.
        fingerprint (dict): what the cache is made of.
        make (callable): makes the cache.
        force (bool): make it even when current.
        logger (callable, optional): where the message goes (default
            mmengine's current logger).

    Returns:
        tuple[DecoderCache, bool]: the cache and whether it was made.
    """
    for path in remove_stale_folders(osp.dirname(osp.realpath(folder))):
        _log(f'removed the stale decoder cache folder {path}', logger)
    cache, reasons = (None, ['remade on request']) if force else \
        _open_current(folder, fingerprint)
    if cache is not None:
        cache.reused = True
        return cache, False
    if osp.isdir(folder):
        _log(
            f'decoder cache {folder}: {", ".join(reasons)}; making it '
            'again', logger)
    return make(), True
