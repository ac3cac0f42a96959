# Copyright (c) mmcalidet contributors. All rights reserved.
"""File helpers: atomic writes and guarded reads."""
import errno
import json
import os
import os.path as osp
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator, Union

PathLike = Union[str, os.PathLike]

#: default size limit for small structured files (priors, class lists)
MAX_SMALL_FILE_BYTES = 256 * 1024 * 1024
#: a YOLO label file of 100k objects is ~4 MB; refuse anything huge
MAX_LABEL_FILE_BYTES = 64 * 1024 * 1024


#: the temporary file of :func:`atomic_write`: ``<name>.incomplete-<random>``
#: plus this suffix, beside the destination
INCOMPLETE_SUFFIX = '.tmp'


def incomplete_prefix(name: str) -> str:
    """The start of the name of :func:`atomic_write`'s temporary files for
    a destination called ``name`` (e.g. ``ann.json.incomplete-``)."""
    return f'{name}.incomplete-'


class _Terminated(BaseException):
    """SIGTERM arrived inside :func:`atomic_write`."""


@contextmanager
def _cleanup_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into an exception inside the block (where it still has
    the default handler, in the main thread), so that the block's clean-up
    runs; the process then still dies of SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum, frame):
        raise _Terminated()

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # die of it, as without us
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def atomic_write(path: PathLike, mode: str = 'w', **kwargs) -> Iterator:
    """Open a temporary file beside ``path``; rename it onto ``path`` only
    when the block finishes without an exception.

    A crash or an error inside the block leaves ``path`` as it was (an
    existing file is never truncated or half-written). The temporary file,
    ``<name>.incomplete-<random>.tmp``, is removed on any exception,
    including ``KeyboardInterrupt`` (Ctrl-C) and SIGTERM (``kill``); only a
    process killed with SIGKILL (``kill -9``) or a power loss can leave it
    behind, and it is then safe to delete.

    Args:
        path (str | PathLike): the destination file.
        mode (str): ``'w'`` (text) or ``'wb'`` (binary).
        **kwargs: passed to :func:`open` (e.g. ``encoding``).

    Yields:
        file object: the temporary file, opened with ``mode``.
    """
    path = os.fspath(path)
    directory = osp.dirname(osp.abspath(path))
    if osp.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f'cannot write {path}: it is '
                                'a folder')
    with _cleanup_on_sigterm():
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(
                prefix=incomplete_prefix(osp.basename(path)),
                suffix=INCOMPLETE_SUFFIX,
                dir=directory)
        except OSError as exc:
            # named by the destination, not the temporary file
            raise type(exc)(exc.errno, f'cannot write {path}: '
                            f'{exc.strerror or exc}') from None
        try:
            # mkstemp makes the file 0600: give it the mode a plain open()
            # would (or keep the mode of the file it replaces)
            if osp.exists(path):
                mode_bits = stat.S_IMODE(os.stat(path).st_mode)
            else:
                umask = os.umask(0)
                os.umask(umask)
                mode_bits = 0o666 & ~umask
            os.chmod(tmp, mode_bits)
            with os.fdopen(fd, mode, **kwargs) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise type(exc)(exc.errno, f'cannot write {path}: '
                                f'{exc.strerror or exc}') from None
        except BaseException:
            if osp.exists(tmp):
                os.remove(tmp)
            raise


def _nearest_folder(path: str, what: str) -> str:
    """The folder ``path`` is or will be made in: itself where it exists,
    else its nearest existing parent (which must be a folder)."""
    folder = osp.abspath(path)
    while not osp.exists(folder):
        folder = osp.dirname(folder)
    if not osp.isdir(folder):
        raise ValueError(f'{what} {path}: {folder} is a file, not a folder')
    return folder


def _probe_folder(folder: str, path: str, what: str) -> None:
    """Make and remove a file in ``folder``: whether ``path`` can be
    written there (``os.access`` says yes to root on read-only mounts)."""
    try:
        fd, probe = tempfile.mkstemp(
            prefix=incomplete_prefix(osp.basename(path) or 'out'),
            suffix=INCOMPLETE_SUFFIX,
            dir=folder)
    except OSError as exc:
        raise ValueError(f'{what} {path} cannot be written ({folder}: '
                         f'{exc.strerror or exc})') from None
    os.close(fd)
    os.remove(probe)


def check_writable_file(path: PathLike, what: str = 'output file') -> str:
    """Check, before any work, that the file ``path`` can be written: not a
    folder, in a folder that exists or can be made and takes new files.
    Nothing is left behind.

    Args:
        path (str | PathLike): the output file.
        what (str): how errors name it (e.g. ``'--out'``).

    Returns:
        str: the path as a string.

    Raises:
        ValueError: one line naming ``what``, the path and the problem.
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f'{what} is empty')
    if osp.isdir(path):
        raise ValueError(f'{what} {path} is a folder, not a file')
    _probe_folder(
        _nearest_folder(osp.dirname(osp.abspath(path)), what), path, what)
    return path


def check_writable_dir(path: PathLike, what: str = 'output folder') -> str:
    """Check, before any work, that the folder ``path`` exists or can be
    made, and takes new files (a file of that name is refused). Nothing is
    made or left behind.

    Args:
        path (str | PathLike): the output folder.
        what (str): how errors name it (e.g. ``'--out-dir'``).

    Returns:
        str: the path as a string.

    Raises:
        ValueError: one line naming ``what``, the path and the problem.
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f'{what} is empty')
    if osp.exists(path) and not osp.isdir(path):
        raise ValueError(f'{what} {path} is a file, not a folder')
    _probe_folder(_nearest_folder(path, what), path, what)
    return path


def check_readable_file(path: PathLike,
                        max_bytes: int = MAX_SMALL_FILE_BYTES,
                        what: str = 'file',
                        allow_empty: bool = False) -> str:
    """Check that ``path`` is an existing, regular, non-empty file no larger
    than ``max_bytes`` (device files such as ``/dev/zero`` and huge files are
    refused before anything is read).

    Args:
        path (str | PathLike): the file.
        max_bytes (int): size limit in bytes.
        what (str): what the file holds, for error messages.
        allow_empty (bool): accept an empty file (e.g. a YOLO label file of
            an image without objects). Defaults to False.

    Returns:
        str: the path as a string.

    Raises:
        ValueError: naming the problem.
    """
    path = os.fspath(path)
    if not osp.exists(path):
        raise ValueError(f'{what} not found: {path}')
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f'{what} is not a regular file: {path}')
    if info.st_size == 0 and not allow_empty:
        raise ValueError(f'{what} is empty: {path}')
    if info.st_size > max_bytes:
        raise ValueError(f'{what} is too large ({info.st_size} bytes > '
                         f'limit {max_bytes}): {path}')
    return path


def read_small_file(path: PathLike,
                    max_bytes: int = MAX_SMALL_FILE_BYTES,
                    what: str = 'file',
                    allow_empty: bool = False) -> bytes:
    """Read a whole file after :func:`check_readable_file`, reading at most
    ``max_bytes``.

    The file is opened without blocking and checked again on the open
    descriptor, so a file swapped for a FIFO or a device after the check
    cannot block the read or fill the memory; a file that grew past the
    limit since is refused too.

    Args:
        path (str | PathLike): the file.
        max_bytes (int): size limit in bytes.
        what (str): what the file holds, for error messages.
        allow_empty (bool): accept an empty file.

    Returns:
        bytes: the content.

    Raises:
        ValueError: naming the file and the problem.
    """
    path = check_readable_file(path, max_bytes, what, allow_empty)
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    with os.fdopen(fd, 'rb') as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f'{what} is not a regular file: {path}')
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f'{what} is too large (more than {max_bytes} '
                         f'bytes): {path}')
    if not data and not allow_empty:
        raise ValueError(f'{what} is empty: {path}')
    return data


def load_json(path: PathLike,
              what: str = 'file',
              max_bytes: int = MAX_SMALL_FILE_BYTES):
    """Read a JSON file after :func:`check_readable_file`.

    Args:
        path (str | PathLike): the file.
        what (str): what the file holds, for error messages.
        max_bytes (int): size limit in bytes.

    Returns:
        The parsed JSON value.

    Raises:
        ValueError: ``"<what> <path> is not valid JSON: ..."`` for a
            syntax error, bad UTF-8 or nesting too deep, or the errors of
            :func:`check_readable_file`.
    """
    path = check_readable_file(path, max_bytes, what)
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f'{what} {path} is not valid JSON: {exc}') from exc
    except RecursionError as exc:
        raise ValueError(f'{what} {path} is not valid JSON: nested too '
                         'deeply') from exc
