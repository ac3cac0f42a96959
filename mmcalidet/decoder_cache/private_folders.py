# Copyright (c) mmcalidet contributors. All rights reserved.
"""The private folders of one process beside a cache folder
(``.<name>.<kind>-<pid>-<tag>@<host>``): where a build writes before its
rename into place (``partial``) and where a replaced cache goes before its
removal (``old``); those of dead processes are removed by the next build."""
import os
import os.path as osp
import re
import shutil
import socket
import uuid
from typing import List

#: a private folder of one process: ``.<name>.<kind>-<pid>-<tag>@<host>``
PRIVATE_NAME = re.compile(r'^\.(?P<name>.+)\.(?P<kind>partial|old)-'
                          r'(?P<pid>\d+)-[0-9a-f]{8}@(?P<host>.+)$')


def private_folder(parent: str, name: str, kind: str = 'partial') -> str:
    """A new folder name in ``parent`` owned by this process."""
    return osp.join(
        parent, f'.{name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}'
        f'@{socket.gethostname()}')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_folders(parent: str) -> List[str]:
    """Remove the private folders of dead processes of this host in
    ``parent`` (a killed build's partial folder, a replaced cache).

    Args:
        parent (str): the folder to clean.

    Returns:
        list[str]: the removed folders.
    """
    if not osp.isdir(parent):
        return []
    host, removed = socket.gethostname(), []
    for entry in os.listdir(parent):
        match = PRIVATE_NAME.match(entry)
        if match is None or match['host'] != host or \
                _alive(int(match['pid'])):
            continue
        shutil.rmtree(osp.join(parent, entry), ignore_errors=True)
        removed.append(osp.join(parent, entry))
    return removed
