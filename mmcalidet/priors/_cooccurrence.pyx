# cython: boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cython core of the relation statistics.

Loops that would be slow in Python, over flat arrays or Python lists:

* :func:`cooccurrence_lists` counts classes and pairs straight from
  per-image Python label lists (lists / tuples of ints, or int64 arrays),
  reading and counting in one pass: flattening them first would cost more
  than the counting.
* :func:`cooccurrence` counts, over images given as a flat label array plus
  offsets, how often each class is present (``n[j]``) and how often two
  classes are present together (``C[i, j]``). A class listed twice in one
  image counts once. Cost: O(sum over images of (distinct classes)^2), no
  K x K x N dense work.
* :func:`tar_members` walks the 512-byte blocks of an (uncompressed) tar
  stream held in memory and returns where each ``*.txt`` member's data lies.
* :func:`parse_yolo` reads the class index of every line of YOLO label files
  held in one buffer.

Python objects are read only through CPython's public C API (the exact type
checks, the list and tuple accessors, ``PyLong_AsLongLongAndOverflow``) and
numpy's C API, plus object identity; nothing here depends on how an
interpreter lays out its objects in memory.

Input checks (ranges, dtypes) are done by the Python wrappers in
:mod:`mmcalidet.priors.statistics` and :mod:`mmcalidet.priors.label_io`.
"""
import numpy as np

cimport numpy as cnp
cimport openmp
from cython.parallel cimport prange

from cpython.ref cimport PyObject

cnp.import_array()

ctypedef cnp.int64_t i64
ctypedef unsigned long long u64


cdef extern from "Python.h":
    # CPython's public C API. The GET accessors return borrowed references
    # and do not check the type: the callers check it first.
    bint PyList_CheckExact(PyObject*)
    bint PyTuple_CheckExact(PyObject*)
    bint PyLong_CheckExact(PyObject*)
    Py_ssize_t PyList_GET_SIZE(PyObject*)
    PyObject* PyList_GET_ITEM(PyObject*, Py_ssize_t)
    Py_ssize_t PyTuple_GET_SIZE(PyObject*)
    PyObject* PyTuple_GET_ITEM(PyObject*, Py_ssize_t)
    long long PyLong_AsLongLongAndOverflow(PyObject*, int*)
    PyObject* PyErr_Occurred()
    void PyErr_Clear()


cdef extern int __builtin_ctzll(unsigned long long) nogil

#: up to this many classes an image's class set is a 2-word bit mask
cdef enum:
    MASK_CLASSES = 128


cdef inline int _int_label(PyObject* obj, long long* out) noexcept:
    """The value of an exact ``int`` that fits a C ``long long``: 0 and
    ``*out``; -1, with no exception left set, for anything else (another
    type, an ``int`` subclass such as ``bool``, a larger int)."""
    cdef int overflow = 0
    if not PyLong_CheckExact(obj):
        return -1
    out[0] = PyLong_AsLongLongAndOverflow(obj, &overflow)
    if overflow != 0:
        return -1
    if out[0] == -1 and PyErr_Occurred() != NULL:  # not expected for an int
        PyErr_Clear()
        return -1
    return 0


# An identity table of the label values' int objects: ``list(range(K))``
# holds the objects the interpreter hands out for 0 .. K - 1, and a label
# that *is* one of them (CPython shares its small ints, so the labels of a
# typical list are) is known from its address by a hash lookup, without a
# call. Any other object goes through ``_int_label``. Only object identity
# is used: the results do not depend on whether, or which, ints are shared.
cdef struct IntSlot:
    PyObject* obj  # NULL: an empty slot
    i64 value


cdef struct IntTable:
    IntSlot* slots  # 2 ** (64 - shift) slots, open addressing
    u64 mask
    int shift


#: the identity table holds the values 0 .. min(K, TABLE_VALUES) - 1
cdef enum:
    TABLE_VALUES = 1024


cdef inline u64 _slot_of(PyObject* obj, int shift) noexcept nogil:
    """Fibonacci hashing: the high bits of the address times 2**64 / phi."""
    return ((<u64><size_t>obj) * <u64>0x9E3779B97F4A7C15ULL) >> shift


cdef object _fill_table(IntTable* table, Py_ssize_t num_classes):
    """Fill ``table`` with the int objects of 0 .. min(K, TABLE_VALUES) - 1.

    Args:
        table (IntTable*): the table to set up.
        num_classes (Py_ssize_t): K.

    Returns:
        tuple: ``(held, buf)``: the int objects and the slots' memory, to
        keep alive while the table is in use.
    """
    cdef Py_ssize_t c, num_values = min(max(num_classes, 0), TABLE_VALUES)
    cdef int bits = 1
    while (<Py_ssize_t>1 << bits) < 2 * num_values:
        bits += 1
    buf = np.zeros((<Py_ssize_t>1 << bits) * sizeof(IntSlot), dtype=np.uint8)
    held = list(range(num_values))
    table.slots = <IntSlot*>cnp.PyArray_DATA(buf)
    table.mask = ((<u64>1) << bits) - 1
    table.shift = 64 - bits
    cdef PyObject* obj
    cdef u64 h
    for c in range(num_values):
        obj = PyList_GET_ITEM(<PyObject*>held, c)
        h = _slot_of(obj, table.shift)
        while table.slots[h].obj != NULL:
            h = (h + 1) & table.mask
        table.slots[h].obj = obj
        table.slots[h].value = c
    return held, buf


cdef inline int _table_label(const IntTable* table, PyObject* obj,
                             long long* out) noexcept:
    """The value of a label object, as :func:`_int_label`: from the
    identity table when ``obj`` is one of its objects, else from
    ``_int_label``."""
    cdef u64 h = _slot_of(obj, table.shift)
    cdef PyObject* key
    while True:
        key = table.slots[h].obj
        if key == obj:
            out[0] = table.slots[h].value
            return 0
        if key == NULL:
            return _int_label(obj, out)
        h = (h + 1) & table.mask


cdef inline bint _is_int64_vector(PyObject* obj) noexcept:
    """Whether ``obj`` is a 1-D native-order 64-bit signed int array."""
    if not cnp.PyArray_Check(<object>obj):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>obj
    cdef int t = cnp.PyArray_TYPE(arr)
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_ISNOTSWAPPED(arr)
            and (t == cnp.NPY_LONG or t == cnp.NPY_LONGLONG)
            and cnp.PyArray_ITEMSIZE(arr) == 8)


cdef Py_ssize_t _count_images(const i64[::1] labels, const i64[::1] offsets,
                              Py_ssize_t k0, Py_ssize_t k1,
                              Py_ssize_t num_classes, i64[:, ::1] C,
                              i64[::1] seen, i64[::1] uniq) noexcept nogil:
    """Count images ``k0 .. k1 - 1`` into ``C`` (one triangle, diagonal
    included). Returns -1, or ``p`` (>= 0) for an out-of-range label at
    ``labels[p]``, or ``-2 - k`` for bad offsets at image ``k``."""
    cdef Py_ssize_t k, p, a, b, m, total = labels.shape[0]
    cdef i64 c, ci
    cdef u64 lo, hi, x
    cdef bint use_mask = num_classes <= MASK_CLASSES
    for k in range(k0, k1):
        if offsets[k + 1] < offsets[k] or offsets[k + 1] > total:
            return -2 - k
        m = 0
        if use_mask:
            # the image's class set as a bit mask: duplicates vanish
            lo = 0
            hi = 0
            for p in range(offsets[k], offsets[k + 1]):
                c = labels[p]
                if c < 0 or c >= num_classes:
                    return p
                if c < 64:
                    lo |= (<u64>1) << c
                else:
                    hi |= (<u64>1) << (c - 64)
            x = lo
            while x:
                uniq[m] = __builtin_ctzll(x)
                m += 1
                x &= x - 1
            x = hi
            while x:
                uniq[m] = 64 + __builtin_ctzll(x)
                m += 1
                x &= x - 1
        else:
            for p in range(offsets[k], offsets[k + 1]):
                c = labels[p]
                if c < 0 or c >= num_classes:
                    return p
                if seen[c] != k + 1:
                    seen[c] = k + 1
                    uniq[m] = c
                    m += 1
        for a in range(m):
            ci = uniq[a]
            for b in range(a, m):
                C[ci, uniq[b]] += 1
    return -1


cdef inline Py_ssize_t _image_classes(PyObject* item, i64 stamp,
                                      Py_ssize_t num_classes,
                                      const IntTable* table, i64* seen,
                                      i64* uniq) noexcept:
    """The distinct classes of one image given as a Python object (an exact
    list or tuple of exact ints, or an int64 vector) into ``uniq``.

    Args:
        item (PyObject*): the image's labels (a borrowed reference).
        stamp (i64): a value unique to this image, marking its classes in
            ``seen`` (used for ``num_classes > MASK_CLASSES`` only).
        num_classes (Py_ssize_t): K.
        table (IntTable*): the identity table of the label values.
        seen (i64*): K entries, the stamp of the last image holding each
            class.
        uniq (i64*): room for K classes.

    Returns:
        Py_ssize_t: the number of distinct classes, or -1 for an object or
        a label this path does not take (the caller falls back).
    """
    cdef Py_ssize_t i, size, stride = 0, m = 0
    cdef long long v
    cdef char* data = NULL
    cdef u64 lo = 0, hi = 0, x
    cdef bint use_mask = num_classes <= MASK_CLASSES
    # 0: list, 1: tuple, 2: int64 vector
    cdef int kind
    if PyList_CheckExact(item):
        kind = 0
        size = PyList_GET_SIZE(item)
    elif PyTuple_CheckExact(item):
        kind = 1
        size = PyTuple_GET_SIZE(item)
    elif _is_int64_vector(item):
        kind = 2
        size = cnp.PyArray_DIMS(<cnp.ndarray>item)[0]
        data = <char*>cnp.PyArray_DATA(<cnp.ndarray>item)
        stride = cnp.PyArray_STRIDES(<cnp.ndarray>item)[0]
    else:
        return -1
    for i in range(size):
        if kind == 2:
            v = (<i64*>(data + i * stride))[0]
        elif _table_label(table, PyList_GET_ITEM(item, i) if kind == 0
                          else PyTuple_GET_ITEM(item, i), &v) < 0:
            return -1
        if v < 0 or v >= num_classes:
            return -1
        if use_mask:
            if v < 64:
                lo |= (<u64>1) << v
            else:
                hi |= (<u64>1) << (v - 64)
        elif seen[v] != stamp:
            seen[v] = stamp
            uniq[m] = v
            m += 1
    if use_mask:
        x = lo
        while x:
            uniq[m] = __builtin_ctzll(x)
            m += 1
            x &= x - 1
        x = hi
        while x:
            uniq[m] = 64 + __builtin_ctzll(x)
            m += 1
            x &= x - 1
    return m


def cooccurrence_lists(seq, Py_ssize_t num_classes):
    """:func:`cooccurrence` straight from per-image Python label lists.

    One pass over the objects, counting as it reads: no flat label array
    is built. Takes a list or tuple whose items are exact lists or tuples of
    exact ``int`` s, or 1-D int64 numpy arrays (any stride). Anything else
    (another container or element type, ``bool`` s, numpy scalars, a label
    outside ``[0, num_classes)``) returns ``None``, so that the caller's
    general path handles it and reports errors with its usual messages.
    Single-threaded (it reads Python objects); no Python code runs during
    the pass, so the borrowed items cannot change under it.

    Args:
        seq (list | tuple): one sequence of class indices per image.
        num_classes (int): K.

    Returns:
        tuple | None: ``(C, n)`` as :func:`cooccurrence` returns them, or
        ``None``.
    """
    cdef PyObject* outer = <PyObject*>seq
    cdef bint outer_list = PyList_CheckExact(outer)
    if not (outer_list or PyTuple_CheckExact(outer)):
        return None
    C_arr = np.zeros((num_classes, num_classes), dtype=np.int64)
    seen_arr = np.zeros(num_classes if num_classes > MASK_CLASSES else 1,
                        dtype=np.int64)
    uniq_arr = np.empty(max(num_classes, 1), dtype=np.int64)
    cdef i64[:, ::1] C = C_arr
    cdef i64* seen = <i64*>cnp.PyArray_DATA(seen_arr)
    cdef i64* uniq = <i64*>cnp.PyArray_DATA(uniq_arr)
    cdef IntTable table
    keep_alive = _fill_table(&table, num_classes)
    cdef Py_ssize_t k, m, a, b
    cdef i64 ci
    # read last: allocating above may run a collection (finalizers)
    cdef Py_ssize_t n = (PyList_GET_SIZE(outer) if outer_list else
                         PyTuple_GET_SIZE(outer))
    for k in range(n):
        m = _image_classes(
            PyList_GET_ITEM(outer, k) if outer_list else
            PyTuple_GET_ITEM(outer, k), k + 1, num_classes, &table, seen,
            uniq)
        if m < 0:
            return None
        for a in range(m):
            ci = uniq[a]
            for b in range(a, m):
                C[ci, uniq[b]] += 1
    # each pair i != j was counted once, in C[i, j] or in C[j, i]
    n_arr = np.diagonal(C_arr).copy()
    sym = C_arr + C_arr.T
    np.fill_diagonal(sym, n_arr)
    return sym, n_arr


#: below this many images one thread counts everything
PARALLEL_MIN_IMAGES = 20000


def cooccurrence(const i64[::1] labels, const i64[::1] offsets,
                 Py_ssize_t num_classes, int num_threads=0):
    """Count class presence and pairwise co-presence over images.

    Large sets are split into contiguous chunks counted by OpenMP threads
    into private matrices, then summed (exact integer counts).

    Args:
        labels (int64 array): class indices of all images, concatenated.
            A value outside ``[0, num_classes)`` raises ValueError (checked
            in the counting loop: no extra pass over the labels).
        offsets (int64 array): ``N + 1`` non-decreasing offsets; image ``k``
            holds ``labels[offsets[k]:offsets[k + 1]]``.
        num_classes (int): K.
        num_threads (int): threads; 0 uses OpenMP's default (one thread
            below ``PARALLEL_MIN_IMAGES`` images).

    Returns:
        tuple[np.ndarray, np.ndarray]: ``C`` (K x K, int64) with ``C[i, j]``
        the number of images where both ``i`` and ``j`` are present
        (``C[j, j] = n[j]``), and ``n`` (K, int64) the number of images
        where ``j`` is present.
    """
    cdef Py_ssize_t num_images = offsets.shape[0] - 1
    cdef Py_ssize_t total = labels.shape[0]
    if num_images < 0 or offsets[0] != 0 or offsets[num_images] != total:
        raise ValueError('offsets must start at 0, be non-decreasing and '
                         f'end at len(labels)={total}')
    cdef int threads = num_threads
    if threads <= 0:
        threads = openmp.omp_get_max_threads() \
            if num_images >= PARALLEL_MIN_IMAGES else 1
    threads = max(1, min(threads, 16, max(num_images, 1)))
    C_all = np.zeros((threads, num_classes, num_classes), dtype=np.int64)
    # seen[t, c] = 1 + index of the last image in which thread t saw c
    # (only used for K > MASK_CLASSES)
    seen_all = np.zeros(
        (threads, num_classes if num_classes > MASK_CLASSES else 1),
        dtype=np.int64)
    uniq_all = np.empty((threads, max(num_classes, 1)), dtype=np.int64)
    status_arr = np.full(threads, -1, dtype=np.int64)
    cdef i64[:, :, ::1] C = C_all
    cdef i64[:, ::1] seen = seen_all
    cdef i64[:, ::1] uniq = uniq_all
    cdef i64[::1] status = status_arr
    cdef Py_ssize_t t, chunk = (num_images + threads - 1) // threads
    for t in prange(threads, nogil=True, num_threads=threads,
                    schedule='static'):
        status[t] = _count_images(labels, offsets, t * chunk,
                                  min((t + 1) * chunk, num_images),
                                  num_classes, C[t], seen[t], uniq[t])
    for t in range(threads):
        if status[t] <= -2:
            raise ValueError('offsets must start at 0, be non-decreasing '
                             f'and end at len(labels)={total}')
        if status[t] >= 0:
            c = labels[status[t]]
            if c < 0:
                raise ValueError(f'class index {c} is negative')
            raise ValueError(f'class index {c} is out of range for '
                             f'num_classes={num_classes}')
    C_arr = C_all.sum(0) if threads > 1 else C_all[0]
    # each pair i != j was counted once, in C[i, j] or in C[j, i]
    n_arr = np.diagonal(C_arr).copy()
    sym = C_arr + C_arr.T
    np.fill_diagonal(sym, n_arr)
    return sym, n_arr


cdef inline i64 _octal(const unsigned char[::1] buf, Py_ssize_t start,
                       Py_ssize_t length) noexcept nogil:
    """Parse a tar octal number field; -1 if it holds a non-octal byte."""
    cdef i64 value = 0
    cdef Py_ssize_t i
    cdef unsigned char ch
    for i in range(start, start + length):
        ch = buf[i]
        if ch == 0 or ch == 32:  # NUL or space terminate / pad
            if value > 0:
                break
            continue
        if ch < 48 or ch > 55:
            return -1
        value = value * 8 + (ch - 48)
    return value


cdef inline void _pax_path(const unsigned char[::1] buf, Py_ssize_t start,
                           Py_ssize_t size, Py_ssize_t* out_pos,
                           Py_ssize_t* out_len) noexcept nogil:
    """Find the ``path`` record of a pax extended header (records are
    ``"<length> <key>=<value>\\n"``); leaves the outputs unchanged if none."""
    cdef Py_ssize_t p = start, end = start + size, rec_len, q, key
    while p < end:
        rec_len = 0
        q = p
        while q < end and 48 <= buf[q] <= 57:
            rec_len = rec_len * 10 + (buf[q] - 48)
            q += 1
        if rec_len <= 0 or q >= end or buf[q] != 32 or p + rec_len > end:
            return
        key = q + 1
        if (key + 5 <= p + rec_len and buf[key] == 112
                and buf[key + 1] == 97 and buf[key + 2] == 116
                and buf[key + 3] == 104 and buf[key + 4] == 61):  # 'path='
            out_pos[0] = key + 5
            out_len[0] = p + rec_len - 1 - (key + 5)  # minus the newline
            return
        p += rec_len


cdef inline bint _name_ends_with_txt(const unsigned char[::1] buf,
                                     Py_ssize_t start,
                                     Py_ssize_t length) noexcept nogil:
    """Whether the name at ``buf[start:start+length]`` (NUL-terminated or
    not) ends with ``.txt``."""
    cdef Py_ssize_t end = start
    while end < start + length and buf[end] != 0:
        end += 1
    if end - start < 4:
        return False
    return (buf[end - 4] == 46 and buf[end - 3] == 116
            and buf[end - 2] == 120 and buf[end - 1] == 116)


def tar_members(const unsigned char[::1] buf):
    """Find the ``*.txt`` regular-file members of a tar stream in memory.

    Only members whose header and data lie wholly in ``buf`` are returned;
    the caller keeps ``buf[consumed:]`` and appends more bytes. A long name
    (GNU ``L`` member or pax ``path`` record) and the member it names are
    consumed together. ustar, GNU and pax archives are understood.

    Args:
        buf (bytes-like): uncompressed tar bytes, starting at a header.

    Returns:
        tuple: ``(data_start, data_size, name_pos, name_len, consumed,
        finished)`` where the first four are int64 arrays (one entry per
        ``*.txt`` member: offset and size of its data, offset and maximal
        length of its name in ``buf``), ``consumed`` is the number of bytes
        fully processed and ``finished`` tells whether the end-of-archive
        marker was reached.

    Raises:
        ValueError: if a header is corrupt (a non-octal size or checksum).
    """
    cdef Py_ssize_t total = buf.shape[0]
    cdef Py_ssize_t cap = total // 512 + 1
    cdef cnp.ndarray[i64, ndim=1] start_arr = np.empty(cap, dtype=np.int64)
    cdef cnp.ndarray[i64, ndim=1] size_arr = np.empty(cap, dtype=np.int64)
    cdef cnp.ndarray[i64, ndim=1] npos_arr = np.empty(cap, dtype=np.int64)
    cdef cnp.ndarray[i64, ndim=1] nlen_arr = np.empty(cap, dtype=np.int64)
    cdef i64[::1] starts = start_arr
    cdef i64[::1] sizes = size_arr
    cdef i64[::1] npos = npos_arr
    cdef i64[::1] nlen = nlen_arr
    cdef Py_ssize_t pos = 0, count = 0, i, data_blocks
    # a pending long name: where its data lies, and the header that began it
    cdef Py_ssize_t name_pos = -1, name_len = 0, name_hdr = -1
    cdef i64 size
    cdef unsigned char flag
    cdef bint finished = False, all_zero
    while True:
        if pos + 512 > total:
            break
        all_zero = True
        for i in range(pos, pos + 512):
            if buf[i] != 0:
                all_zero = False
                break
        if all_zero:
            finished = True
            pos += 512
            break
        size = _octal(buf, pos + 124, 12)
        if size < 0 or _octal(buf, pos + 148, 8) < 0:
            raise ValueError(
                f'corrupt tar header at byte {pos} of the stream')
        data_blocks = (size + 511) // 512
        if pos + 512 + data_blocks * 512 > total:
            break  # member not complete yet
        flag = buf[pos + 156]
        if flag == 76 or flag == 120:  # 'L' GNU long name, 'x' pax header
            if name_hdr < 0:
                name_hdr = pos
            if flag == 76:
                name_pos = pos + 512
                name_len = size
            else:
                _pax_path(buf, pos + 512, size, &name_pos, &name_len)
        elif flag == 48 or flag == 0 or flag == 55:  # regular file
            if name_pos >= 0:
                npos[count] = name_pos
                nlen[count] = name_len
            else:
                npos[count] = pos
                nlen[count] = 100
            if _name_ends_with_txt(buf, npos[count], nlen[count]):
                starts[count] = pos + 512
                sizes[count] = size
                count += 1
            name_pos = -1
            name_hdr = -1
        elif flag != 103:  # directories, links ('g' global pax: skipped)
            name_pos = -1
            name_hdr = -1
        pos += 512 + data_blocks * 512
    if not finished and name_hdr >= 0:
        pos = name_hdr  # keep the long name with the member it names
    return (start_arr[:count].copy(), size_arr[:count].copy(),
            npos_arr[:count].copy(), nlen_arr[:count].copy(), pos, finished)


cdef inline bint _is_space(unsigned char ch) noexcept nogil:
    return ch == 32 or ch == 9 or ch == 13 or ch == 11 or ch == 12


def parse_yolo(const unsigned char[::1] buf, const i64[::1] starts,
               const i64[::1] sizes, Py_ssize_t num_fields=5):
    """Read the class index of each line of YOLO label files in a buffer.

    Each non-blank line must hold ``num_fields`` whitespace-separated fields
    whose first is a non-negative integer (the class index).

    Args:
        buf (bytes-like): the buffer holding every file's bytes.
        starts (int64 array): offset of each file in ``buf``.
        sizes (int64 array): size of each file.
        num_fields (int): fields per line. Defaults to 5.

    Returns:
        tuple: ``(labels, offsets, bad_file, bad_line, bad_fields)``:
        ``labels`` (int64) are the class indices of all files concatenated,
        ``offsets`` (int64, N + 1) delimit each file's labels. If a line is
        malformed, parsing stops and ``bad_file`` (index into ``starts``),
        ``bad_line`` (1-based) and ``bad_fields`` (number of fields found,
        or -1 for a non-integer class) describe it; else all three are -1.
    """
    cdef Py_ssize_t num_files = starts.shape[0]
    cdef Py_ssize_t cap = 1
    cdef Py_ssize_t f
    for f in range(num_files):
        cap += sizes[f] // 2 + 1
    cdef cnp.ndarray[i64, ndim=1] label_arr = np.empty(cap, dtype=np.int64)
    cdef cnp.ndarray[i64, ndim=1] off_arr = np.zeros(num_files + 1,
                                                     dtype=np.int64)
    cdef i64[::1] labels = label_arr
    cdef i64[::1] offs = off_arr
    cdef Py_ssize_t count = 0, p, end, line_no, fields
    cdef i64 cls
    cdef bint in_field, cls_ok, first_field
    cdef unsigned char ch
    cdef Py_ssize_t bad_file = -1, bad_line = -1, bad_fields = -1
    with nogil:
        for f in range(num_files):
            p = starts[f]
            end = starts[f] + sizes[f]
            line_no = 0
            while p < end and bad_file < 0:
                line_no += 1
                fields = 0
                in_field = False
                cls = 0
                cls_ok = True
                while p < end and buf[p] != 10:
                    ch = buf[p]
                    if _is_space(ch):
                        in_field = False
                    else:
                        if not in_field:
                            in_field = True
                            fields += 1
                        if fields == 1:
                            if 48 <= ch <= 57 and cls < 1000000000:
                                cls = cls * 10 + (ch - 48)
                            else:
                                cls_ok = False
                    p += 1
                p += 1  # skip the newline
                if fields == 0:
                    continue
                if fields != num_fields:
                    bad_file = f
                    bad_line = line_no
                    bad_fields = fields
                elif not cls_ok:
                    bad_file = f
                    bad_line = line_no
                    bad_fields = -1
                else:
                    labels[count] = cls
                    count += 1
            offs[f + 1] = count
            if bad_file >= 0:
                break
    return (label_arr[:count].copy(), off_arr, bad_file, bad_line,
            bad_fields)
