# Copyright (c) mmcalidet contributors. All rights reserved.
"""``.npy`` files written by appending rows, and their headers checked
against the file size (a torn write shows as a short file)."""
import os
import struct
from typing import Optional, Sequence, Tuple

import numpy as np

#: bytes reserved for an appended file's header (a multiple of 64, as
#: numpy aligns it); the shape is written again there on close
HEADER_BYTES = 256


def _header(dtype: np.dtype, shape: Sequence[int]) -> bytes:
    text = repr({
        'descr': np.lib.format.dtype_to_descr(np.dtype(dtype)),
        'fortran_order': False,
        'shape': tuple(int(s) for s in shape),
    }).encode('latin1')
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f'shape {tuple(shape)} does not fit a .npy header')
    return (b'\x93NUMPY\x01\x00' + struct.pack('<H', HEADER_BYTES - 10) +
            text + b' ' * pad + b'\n')


class NpyAppender:
    """A ``.npy`` file written row block by row block with plain writes
    (so a full disk raises ``OSError`` rather than a memory-map fault);
    the header gets the final row count on :meth:`close`.

    Args:
        path (str): the file (created).
        dtype (str | np.dtype): the stored type.
        row_shape (Sequence[int]): the shape of one row.
    """

    def __init__(self, path: str, dtype, row_shape: Sequence[int]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(s) for s in row_shape)
        self.rows = 0
        self._file = open(path, 'wb')
        self._file.write(_header(self.dtype, (0, ) + self.row_shape))

    @property
    def shape(self) -> Tuple[int, ...]:
        return (self.rows, ) + self.row_shape

    def append(self, rows: np.ndarray) -> None:
        """Write rows (B, *row_shape)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if tuple(rows.shape[1:]) != self.row_shape:
            raise ValueError(f'{self.path}: rows of shape {rows.shape[1:]} '
                             f'for a file of rows {self.row_shape}')
        self._file.write(rows.tobytes())
        self.rows += len(rows)

    def close(self) -> None:
        """Write the final header and close the file."""
        if self._file.closed:
            return
        try:
            self._file.seek(0)
            self._file.write(_header(self.dtype, self.shape))
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()


def npy_problem(path: str, shape: Sequence[int], dtype) -> Optional[str]:
    """What is wrong with a ``.npy`` file that should hold an array of
    ``shape`` and ``dtype``.

    Args:
        path (str): the file.
        shape (Sequence[int]): the expected shape.
        dtype (str | np.dtype): the expected type.

    Returns:
        str, optional: ``None`` when the header says ``shape`` and
        ``dtype`` and the file is as long as they need; else the problem
        (missing, unreadable header, other shape or type, truncated).
    """
    if not os.path.isfile(path):
        return 'missing'
    try:
        with open(path, 'rb') as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (
                1, 0) else np.lib.format.read_array_header_2_0
            found, fortran, found_dtype = read(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as exc:
        return f'unreadable .npy header ({exc})'
    shape = tuple(int(s) for s in shape)
    if tuple(found) != shape or fortran:
        return f'shape {tuple(found)} where the cache records {shape}'
    if found_dtype != np.dtype(dtype):
        return f'type {found_dtype} where the cache records {dtype}'
    size = os.path.getsize(path)
    need = offset + int(np.prod(shape, dtype=np.int64)) * found_dtype.itemsize
    if size != need:
        state = 'truncated' if size < need else 'too long'
        return f'{state} ({size} bytes, {need} expected)'
    return None
