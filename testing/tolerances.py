# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tolerance of "identical" between floats of two computational routes.

Two routes that promise the same result (a deployed prior's cached V' and
a call prior's V', a batch of 3 and a batch of 2, a cache and the full
forward) give the same bits on one machine, but another x86-64 CPU, even
with the same torch and the same ``cpu_capability``, may take other oneDNN
/ MKL kernels for one of them and round the last bits (relative ~1e-8 to
1e-7) another way. Those floats are compared within :data:`TIGHT_RTOL` /
:data:`TIGHT_ATOL`: some eight float32 roundings (1.2e-7 each), far below
any real change (a score moved by 1e-4 fails). Integers, labels, counts,
strings and booleans stay exact, as do floats that one route computes (a
round trip, the same function on the same inputs, label counts).
"""
import math
from typing import Any

import numpy as np
import torch

#: relative tolerance of :func:`assert_same_floats` (float32 values of
#: order 1: about 8 float32 roundings)
TIGHT_RTOL = 1e-6
#: absolute tolerance of :func:`assert_same_floats` (values near 0)
TIGHT_ATOL = 1e-7
#: both, as keyword arguments of ``torch.testing.assert_close`` /
#: ``np.testing.assert_allclose``
TIGHT = dict(rtol=TIGHT_RTOL, atol=TIGHT_ATOL)


def assert_same_floats(actual: Any, expected: Any, msg: str = '') -> None:
    """Floats of two routes are the same within :data:`TIGHT` (NaN equals
    NaN; shapes and dtypes must match).

    Args:
        actual: a tensor, an array or a number.
        expected: the same kind of value.
        msg (str): what is compared, for the failure message.
    """
    torch.testing.assert_close(
        torch.as_tensor(np.asarray(actual))
        if not isinstance(actual, torch.Tensor) else actual,
        torch.as_tensor(np.asarray(expected))
        if not isinstance(expected, torch.Tensor) else expected,
        equal_nan=True,
        msg=(lambda text: f'{msg}: {text}') if msg else None,
        **TIGHT)


def _is_float(value: Any) -> bool:
    return isinstance(value,
                      (float, np.floating)) or (isinstance(value, np.ndarray)
                                                and value.dtype.kind == 'f')


def assert_same_rows(actual: Any, expected: Any, where: str = 'row') -> None:
    """Result rows (dicts, lists, numbers, strings, arrays) of two routes
    are the same: floats within :data:`TIGHT` (NaN equals NaN), everything
    else (keys, lengths, integers, strings, booleans, None) exactly.

    Args:
        actual: a row, or a list or dict of them.
        expected: the other route's.
        where (str): the path to this value, for the failure message.
    """
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f'{where}: {actual!r} is no dict'
        assert sorted(actual) == sorted(expected), \
            f'{where}: keys {sorted(actual)} != {sorted(expected)}'
        for key in expected:
            assert_same_rows(actual[key], expected[key], f'{where}[{key!r}]')
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and \
            len(actual) == len(expected), f'{where}: {actual!r} != ' \
            f'{expected!r}'
        for i, (a, b) in enumerate(zip(actual, expected)):
            assert_same_rows(a, b, f'{where}[{i}]')
    elif _is_float(actual) or _is_float(expected):
        if isinstance(actual, np.ndarray) or isinstance(expected, np.ndarray):
            assert_same_floats(actual, expected, where)
            return
        assert _is_float(actual) and _is_float(expected), \
            f'{where}: {actual!r} != {expected!r}'
        a, b = float(actual), float(expected)
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(
            a, b, rel_tol=TIGHT_RTOL, abs_tol=TIGHT_ATOL), \
            f'{where}: {a!r} != {b!r} (beyond rtol={TIGHT_RTOL}, ' \
            f'atol={TIGHT_ATOL})'
    elif isinstance(expected, np.ndarray):
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    else:
        assert actual == expected, f'{where}: {actual!r} != {expected!r}'


def assert_same_predictions(actual: Any, expected: Any) -> None:
    """Two routes' detections of one image under the same prior are the
    same: the labels and the boxes (which no prior moves) exactly, the
    scores within :data:`TIGHT`.

    Args:
        actual: a ``DetDataSample`` (its ``pred_instances``) or an
            ``InstanceData``.
        expected: the other route's.
    """
    a = getattr(actual, 'pred_instances', actual)
    b = getattr(expected, 'pred_instances', expected)
    assert torch.equal(a.labels, b.labels), 'labels differ'
    assert torch.equal(a.bboxes, b.bboxes), 'boxes differ'
    assert_same_floats(a.scores, b.scores, 'scores')
