# Copyright (c) mmcalidet contributors. All rights reserved.
# Included by _deform_attn_cpu.pyx (compiled for any x86-64 or other CPU)
# and _deform_attn_cpu_avx2.pyx (compiled with AVX2 and FMA, taken where the
# CPU has them).
# Cython core of multi-scale deformable attention on the CPU: each
# sampling point's bilinear sample of the values (mmcv's ``grid_sample`` with
# zero padding and ``align_corners=False``), weighted by its attention weight
# and summed, and the gradients of that sum, in one pass over the points.
# Every location and attention weight is finite (the wrapper sends others to
# mmcv's function).
#
# The loops run over (batch element, head) pairs in OpenMP threads: every
# pair reads and writes only its own slice of the value, output and gradient
# tensors, so no two threads write the same element and the sums are added
# in the same order whatever the number of threads.
#
# The Python wrapper (:mod:`mmcalidet.models.layers.cpu_deform_attn`) checks
# the shapes and dtypes first and gives its own errors; every array is
# C-contiguous, float32 or float64 (one dtype for all). Both entries check
# again, in O(levels), what they index by (_check_levels, _check_arrays):
# called directly with level shapes, level starts or arrays that do not
# agree, they raise ValueError rather than read or write outside an array;
# a thread count outside [1, MAX_THREADS] (which OpenMP would try to
# allocate) too (_check_threads).
from cython.parallel cimport prange
from libc.stdint cimport int64_t

ctypedef fused real:
    float
    double


cdef inline real _dot(const real *x, const real *y,
                      Py_ssize_t n) noexcept nogil:
    # eight partial sums, so that the compiler can keep them in vectors
    cdef real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        s0 = s0 + x[i] * y[i]
        s1 = s1 + x[i + 1] * y[i + 1]
        s2 = s2 + x[i + 2] * y[i + 2]
        s3 = s3 + x[i + 3] * y[i + 3]
        s4 = s4 + x[i + 4] * y[i + 4]
        s5 = s5 + x[i + 5] * y[i + 5]
        s6 = s6 + x[i + 6] * y[i + 6]
        s7 = s7 + x[i + 7] * y[i + 7]
        i = i + 8
    while i < n:
        s0 = s0 + x[i] * y[i]
        i = i + 1
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


cdef inline void _axpy(real alpha, const real *x, real *y,
                       Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = y[i] + alpha * x[i]


cdef inline int64_t _floor(real x) noexcept nogil:
    # floor of a value within int64's range, without a libm call
    cdef int64_t i = <int64_t>x
    return i - 1 if x < i else i


cdef inline real _pixel(real location, int64_t size) noexcept nogil:
    # the pixel coordinate of a location in [0, 1] (align_corners=False),
    # clamped to [-2, size + 1]: beyond a pixel outside the map both corners
    # are outside, and the integer conversion stays exact
    cdef real x = location * size - <real>0.5
    if x < -2:
        return -2
    if x > size + 1:
        return size + 1
    return x


#: the most OpenMP threads an entry takes
MAX_THREADS = 1024


cdef int _check_threads(int num_threads) except -1:
    if num_threads < 1 or num_threads > MAX_THREADS:
        raise ValueError(f'num_threads must be an integer in [1, '
                         f'{MAX_THREADS}], got {num_threads}')
    return 0


cdef int _check_levels(const int64_t[:, ::1] shapes,
                       const int64_t[::1] starts, Py_ssize_t keys,
                       Py_ssize_t levels) except -1:
    # the levels' (h, w) are positive, each level starts where the one
    # before it ends (the cumulative sum of h * w, compared without
    # overflow) and they cover the keys: then every key index is in
    # [0, keys)
    cdef Py_ssize_t lv
    cdef int64_t h, w, total = 0
    if shapes.shape[0] != levels or shapes.shape[1] != 2 or \
            starts.shape[0] != levels:
        raise ValueError(
            f'shapes must be ({levels}, 2) and starts ({levels}, ) for the '
            f'{levels} levels of the locations; got ({shapes.shape[0]}, '
            f'{shapes.shape[1]}) and ({starts.shape[0]}, )')
    for lv in range(levels):
        h = shapes[lv, 0]
        w = shapes[lv, 1]
        if h <= 0 or w <= 0:
            raise ValueError(
                f'shapes must be positive; level {lv} is ({h}, {w})')
        if starts[lv] != total:
            raise ValueError(
                f'starts must be the cumulative sums of h * w; level {lv} '
                f'starts at {starts[lv]}, not {total}')
        if w > keys - total or h > (keys - total) // w:
            raise ValueError(
                f'level {lv} of shape ({h}, {w}) starting at {total} ends '
                f'past the {keys} keys of value')
        total = total + h * w
    if total != keys:
        raise ValueError(f'shapes cover {total} keys, value has {keys}')
    return 0


cdef tuple _dims(const Py_ssize_t *shape, int ndim):
    # an array's shape, as a tuple (for the messages)
    return tuple([shape[i] for i in range(ndim)])


cdef inline bint _same(const Py_ssize_t *a, const Py_ssize_t *b,
                       int ndim) noexcept:
    # whether two shapes agree in their first ndim dimensions
    cdef int i
    for i in range(ndim):
        if a[i] != b[i]:
            return False
    return True


cdef int _check_arrays(const Py_ssize_t *value, const Py_ssize_t *locations,
                       const Py_ssize_t *attention,
                       const Py_ssize_t *output) except -1:
    # the arrays' shapes agree with value's (bs, keys, heads, dims) and the
    # locations' (bs, queries, heads, levels, points, 2)
    if value[0] != locations[0] or value[2] != locations[2] or \
            locations[5] != 2 or not _same(attention, locations, 5) or \
            not _same(output, locations, 3) or output[3] != value[3]:
        raise ValueError(
            'value (bs, keys, heads, dims), locations (bs, queries, heads, '
            'levels, points, 2), attention (bs, queries, heads, levels, '
            'points) and output (bs, queries, heads, dims) do not agree: '
            f'{_dims(value, 4)}, {_dims(locations, 6)}, '
            f'{_dims(attention, 5)}, {_dims(output, 4)}')
    return 0


def deform_attn_forward(const real[:, :, :, ::1] value,
                        const int64_t[:, ::1] shapes,
                        const int64_t[::1] starts,
                        const real[:, :, :, :, :, ::1] locations,
                        const real[:, :, :, :, ::1] attention,
                        real[:, :, :, ::1] output, int num_threads):
    """Add each query's attended samples to ``output``.

    Args:
        value: ``(bs, keys, heads, dims)``.
        shapes: ``(levels, 2)``, each level's ``(h, w)``.
        starts: ``(levels, )``, each level's first key.
        locations: ``(bs, queries, heads, levels, points, 2)``, ``(x, y)``
            in [0, 1] of the level.
        attention: ``(bs, queries, heads, levels, points)``.
        output: ``(bs, queries, heads, dims)``, zeros on entry.
        num_threads: OpenMP threads, in [1, MAX_THREADS].

    Raises:
        ValueError: shapes that are not positive, starts that are not the
            cumulative sums of their h * w, levels that do not cover the
            keys, arrays whose shapes do not agree, or a thread count
            outside [1, MAX_THREADS].
    """
    cdef Py_ssize_t bs = value.shape[0], heads = value.shape[2]
    cdef Py_ssize_t dims = value.shape[3], queries = locations.shape[1]
    cdef Py_ssize_t levels = locations.shape[3]
    cdef Py_ssize_t points = locations.shape[4]
    cdef Py_ssize_t pair, b, hd, q, lv, p, cy, cx
    cdef int64_t x0, y0, xx, yy, w, h
    cdef real px, py, fx, fy, a, weight
    cdef real *out
    _check_threads(num_threads)
    _check_arrays(value.shape, locations.shape, attention.shape,
                  output.shape)
    _check_levels(shapes, starts, value.shape[1], levels)
    for pair in prange(bs * heads, nogil=True, num_threads=num_threads,
                       schedule='static'):
        b = pair // heads
        hd = pair % heads
        for q in range(queries):
            out = &output[b, q, hd, 0]
            for lv in range(levels):
                h = shapes[lv, 0]
                w = shapes[lv, 1]
                for p in range(points):
                    # pixel coordinates, their top-left corner and the
                    # fractions past it
                    px = _pixel(locations[b, q, hd, lv, p, 0], w)
                    py = _pixel(locations[b, q, hd, lv, p, 1], h)
                    a = attention[b, q, hd, lv, p]
                    x0 = _floor(px)
                    y0 = _floor(py)
                    fx = px - x0
                    fy = py - y0
                    for cy in range(2):
                        yy = y0 + cy
                        if yy < 0 or yy >= h:
                            continue
                        for cx in range(2):
                            xx = x0 + cx
                            if xx < 0 or xx >= w:
                                continue
                            weight = a * (fy if cy else 1 - fy) * (
                                fx if cx else 1 - fx)
                            _axpy(weight,
                                  &value[b, starts[lv] + yy * w + xx, hd, 0],
                                  out, dims)


def deform_attn_backward(const real[:, :, :, ::1] value,
                         const int64_t[:, ::1] shapes,
                         const int64_t[::1] starts,
                         const real[:, :, :, :, :, ::1] locations,
                         const real[:, :, :, :, ::1] attention,
                         const real[:, :, :, ::1] grad_output,
                         real[:, :, :, ::1] grad_value,
                         real[:, :, :, :, :, ::1] grad_locations,
                         real[:, :, :, :, ::1] grad_attention,
                         int num_threads):
    """The gradients of :func:`deform_attn_forward`'s output.

    Args:
        value, shapes, starts, locations, attention: as in
            :func:`deform_attn_forward`.
        grad_output: ``(bs, queries, heads, dims)``.
        grad_value: the shape of ``value``, zeros on entry; the gradient
            is added.
        grad_locations: the shape of ``locations``, overwritten.
        grad_attention: the shape of ``attention``, overwritten.
        num_threads: OpenMP threads, in [1, MAX_THREADS].

    Raises:
        ValueError: as :func:`deform_attn_forward`'s, or gradients of
            other shapes than the arrays they are of.
    """
    cdef Py_ssize_t bs = value.shape[0], heads = value.shape[2]
    cdef Py_ssize_t dims = value.shape[3], queries = locations.shape[1]
    cdef Py_ssize_t levels = locations.shape[3]
    cdef Py_ssize_t points = locations.shape[4]
    cdef Py_ssize_t pair, b, hd, q, lv, p, cy, cx, key
    cdef int64_t x0, y0, xx, yy, w, h
    cdef real px, py, fx, fy, a, wy, wx, dot, gx, gy, ga
    cdef const real *grad
    _check_threads(num_threads)
    _check_arrays(value.shape, locations.shape, attention.shape,
                  grad_output.shape)
    if not _same(grad_value.shape, value.shape, 4) or \
            not _same(grad_locations.shape, locations.shape, 6) or \
            not _same(grad_attention.shape, attention.shape, 5):
        raise ValueError('grad_value, grad_locations and grad_attention '
                         'must be the shapes of value, locations and '
                         'attention')
    _check_levels(shapes, starts, value.shape[1], levels)
    for pair in prange(bs * heads, nogil=True, num_threads=num_threads,
                       schedule='static'):
        b = pair // heads
        hd = pair % heads
        for q in range(queries):
            grad = &grad_output[b, q, hd, 0]
            for lv in range(levels):
                h = shapes[lv, 0]
                w = shapes[lv, 1]
                for p in range(points):
                    px = _pixel(locations[b, q, hd, lv, p, 0], w)
                    py = _pixel(locations[b, q, hd, lv, p, 1], h)
                    a = attention[b, q, hd, lv, p]
                    x0 = _floor(px)
                    y0 = _floor(py)
                    fx = px - x0
                    fy = py - y0
                    # d sample / d (attention, pixel x, pixel y), each
                    # dotted with the output's gradient
                    ga = 0
                    gx = 0
                    gy = 0
                    for cy in range(2):
                        yy = y0 + cy
                        if yy < 0 or yy >= h:
                            continue
                        wy = fy if cy else 1 - fy
                        for cx in range(2):
                            xx = x0 + cx
                            if xx < 0 or xx >= w:
                                continue
                            wx = fx if cx else 1 - fx
                            key = starts[lv] + yy * w + xx
                            dot = _dot(grad, &value[b, key, hd, 0], dims)
                            _axpy(a * wy * wx, grad,
                                  &grad_value[b, key, hd, 0], dims)
                            ga = ga + wy * wx * dot
                            gx = gx + (wy if cx else -wy) * dot
                            gy = gy + (wx if cy else -wx) * dot
                    grad_attention[b, q, hd, lv, p] = ga
                    # the pixel coordinate is location * size - 0.5
                    grad_locations[b, q, hd, lv, p, 0] = gx * a * w
                    grad_locations[b, q, hd, lv, p, 1] = gy * a * h
