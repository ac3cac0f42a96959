# Copyright (c) mmcalidet contributors. All rights reserved.
"""Image-level labels from a ``.tar.gz`` (or ``.tar``) of YOLO label
files, streamed: the archive is inflated in bounded pieces and its members
parsed as they arrive (by the Cython core), never extracted to disk.
"""
import os.path as osp
import zlib
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np

from ..utils.file_io import MAX_LABEL_FILE_BYTES, check_readable_file
from ._cooccurrence import parse_yolo, tar_members
from .label_io import (LabelSets, ProgressFn, check_label_range,
                       check_yolo_result)

#: decompression chunk of the streamed tarball reader
TAR_CHUNK_BYTES = 1 << 20


def _member_name(buf: np.ndarray, pos: int, length: int) -> str:
    raw = bytes(buf[pos:pos + length]).split(b'\0', 1)[0]
    return raw.decode('utf-8', 'replace')


#: longest GNU long-name / pax record kept in memory (real ones: < 4 kB)
MAX_TAR_NAME_RECORD_BYTES = 1 << 20


def _tar_number(field: bytes) -> int:
    """A tar header's octal number (-1 if it is not one)."""
    text = field.split(b'\0', 1)[0].strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return -1


def _pax_path(data: bytes) -> Optional[str]:
    """The ``path`` record of pax extended-header data."""
    for record in data.split(b'\n'):
        _, _, field = record.partition(b' ')
        if field.startswith(b'path='):
            return field[5:].decode('utf-8', 'replace')
    return None


def _pending_member(pending: bytearray, path: str) -> Tuple[int, int]:
    """Look at the member the tar stream ``pending`` starts with (the one
    :func:`tar_members` could not finish), before its data is buffered.

    Returns:
        tuple: ``(need, drop)``: keep buffering until ``pending`` holds
        ``need`` bytes (0: parse at the next piece), or drop the member (a
        large member that is not a label file): its headers and data, the
        first ``drop`` bytes of the stream from here (``drop`` > 0).

    Raises:
        ValueError: for a ``*.txt`` member larger than
            ``MAX_LABEL_FILE_BYTES`` or a huge name record.
    """
    pos, name = 0, None
    while len(pending) >= pos + 512:
        header = bytes(pending[pos:pos + 512])
        if not any(header):
            return 0, 0  # the end-of-archive marker
        size = _tar_number(header[124:136])
        if size < 0:
            return 0, 0  # tar_members reports the corrupt header
        total = 512 + (size + 511) // 512 * 512
        flag = header[156:157]
        if flag in (b'L', b'x', b'g'):  # long name, pax headers
            if size > MAX_TAR_NAME_RECORD_BYTES:
                raise ValueError(f'{path}: corrupt tar archive (a name '
                                 f'record of {size} bytes)')
            if len(pending) < pos + total:
                return pos + total, 0
            data = bytes(pending[pos + 512:pos + 512 + size])
            if flag == b'L':
                name = data.split(b'\0', 1)[0].decode('utf-8', 'replace')
            elif flag == b'x':
                name = _pax_path(data) or name
            pos += total
            continue
        if name is None:
            name = header[:100].split(b'\0', 1)[0].decode('utf-8', 'replace')
        label_file = flag in (b'0', b'\0', b'7') and name.endswith('.txt')
        if label_file and size > MAX_LABEL_FILE_BYTES:
            raise ValueError(f'{path}:{name}: label file is too large '
                             f'({size} bytes > limit {MAX_LABEL_FILE_BYTES})')
        if not label_file and size > TAR_CHUNK_BYTES:
            return 0, pos + total  # not a label file: never buffered
        return pos + total, 0
    return 0, 0


def _tar_pieces(f, gz: bool, path: str,
                progress: ProgressFn) -> Iterator[bytes]:
    """The uncompressed bytes of a tarball, in pieces of at most
    ``TAR_CHUNK_BYTES`` (a highly compressed chunk is inflated in bounded
    steps, never whole)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else None
    while True:
        raw = f.read(TAR_CHUNK_BYTES)
        if progress is not None and raw:
            progress(len(raw))
        if not gz:
            if not raw:
                return
            yield raw
            continue
        data = raw
        while data and not inflate.eof:
            piece = inflate.decompress(data, TAR_CHUNK_BYTES)
            if piece:
                yield piece
            data = inflate.unconsumed_tail
        if not raw:
            if not inflate.eof:
                raise ValueError(f'{path}: truncated gzip stream')
            return


def read_yolo_tarball(path: str,
                      classes: Optional[Sequence[str]] = None,
                      progress: ProgressFn = None,
                      keep_names: bool = False) -> LabelSets:
    """Image-level labels from a ``.tar.gz`` (or ``.tar``) of YOLO label
    files, streamed: decompressed in chunks, never extracted to disk.

    Memory stays bounded: the stream is inflated in pieces of at most
    ``TAR_CHUNK_BYTES``; a large member that is not a ``*.txt`` file is
    skipped without being buffered; a ``*.txt`` member larger than
    ``MAX_LABEL_FILE_BYTES`` is refused from its header, before its data
    is read.

    Args:
        path (str): the tarball.
        classes (Sequence[str], optional): class names by index.
        progress (callable, optional): called with the number of compressed
            bytes read since the last call.
        keep_names (bool): keep member names in ``extra['files']``.

    Returns:
        LabelSets: one entry per ``*.txt`` member, in archive order.

    Raises:
        ValueError: naming the tarball (and member, line): corrupt or
            truncated stream, a bad line, a label file over the limit.
    """
    check_readable_file(path, what='tarball', max_bytes=1 << 40)
    gz = path.endswith('.gz') or path.endswith('.tgz')
    pending = bytearray()
    all_labels, all_counts, names = [], [], []
    finished = False
    need = drop = 0  # see _pending_member
    bytes_read = 0

    def counted(num_bytes: int) -> None:
        nonlocal bytes_read
        bytes_read += num_bytes
        if progress is not None:
            progress(num_bytes)

    try:
        with open(path, 'rb') as f:
            for piece in _tar_pieces(f, gz, path, counted):
                if drop:
                    skipped = min(drop, len(piece))
                    drop -= skipped
                    piece = piece[skipped:]
                pending += piece
                if drop or len(pending) < need:
                    continue
                buf = np.frombuffer(bytes(pending), dtype=np.uint8)
                (starts, sizes, npos, nlen, consumed,
                 finished) = tar_members(buf)
                labels, offsets = check_yolo_result(
                    parse_yolo(buf, starts, sizes),
                    # buf bound now: it is deleted once the chunk is read
                    lambda k, b=buf:
                    f'{path}:{_member_name(b, npos[k], nlen[k])}')
                all_labels.append(labels)
                all_counts.append(np.diff(offsets))
                if keep_names:
                    names.extend(
                        _member_name(buf, p, n) for p, n in zip(npos, nlen))
                del buf
                del pending[:consumed]
                if finished:
                    break
                need, drop = _pending_member(pending, path)
                if drop:
                    skipped = min(drop, len(pending))
                    del pending[:skipped]
                    drop -= skipped
                    need = 0
            if not finished and (len(pending) or drop):
                raise ValueError(f'{path}: truncated tar archive')
    except zlib.error as exc:
        raise ValueError(f'{path}: corrupt gzip stream: {exc}') from exc
    if progress is not None:  # the padding after the end-of-archive marker
        progress(osp.getsize(path) - bytes_read)
    counts = np.concatenate(all_counts) if all_counts else np.zeros(0, int)
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    labels = np.concatenate(all_labels).astype(np.int64) if all_labels \
        else np.zeros(0, dtype=np.int64)
    if offsets.size == 1:
        raise ValueError(f'no YOLO label files (*.txt) in {path}')
    names_ = list(classes) if classes is not None else None
    check_label_range(labels, len(names_) if names_ else None, path)
    extra = dict(files=names) if keep_names else {}
    return LabelSets(labels, offsets, names_, source=path, extra=extra)
