# Copyright (c) mmcalidet contributors. All rights reserved.
"""Load mmengine checkpoints with torch's ``weights_only=True`` default.

torch >= 2.6 unpickles checkpoints with ``weights_only=True`` and mmengine
0.10.7 does not pass ``weights_only``, so ``load_from``, ``resume`` and
``load_checkpoint`` fail on the non-tensor objects mmengine itself saves:
the message hub's ``HistoryBuffer`` objects (numpy arrays and scalars
inside) and, in their state, the buffer's statistics methods pickled as
``getattr(HistoryBuffer, 'min')``.

Rather than switching ``weights_only`` off, this module allowlists exactly
those types, and maps the pickle's ``builtins.getattr`` to
:func:`history_buffer_getattr`, which only returns the statistics methods
of ``HistoryBuffer`` and refuses any other attribute lookup. Importing
``mmcalidet`` registers them.
"""
import inspect
import pickle
from typing import Any

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def history_buffer_getattr(obj: Any, name: str) -> Any:
    """``getattr`` restricted to the methods ``HistoryBuffer`` pickles.

    Args:
        obj: must be the ``HistoryBuffer`` class.
        name (str): a public method defined on ``HistoryBuffer`` (``min``,
            ``max``, ``current``, ``mean``, ...).

    Returns:
        the function.

    Raises:
        pickle.UnpicklingError: for any other object or name.
    """
    method = vars(HistoryBuffer).get(name) \
        if obj is HistoryBuffer and isinstance(name, str) else None
    if method is None or name.startswith('_') or \
            not inspect.isfunction(method):
        raise pickle.UnpicklingError(
            f'checkpoint asks for getattr({obj!r}, {name!r}); only the '
            'statistics methods of mmengine HistoryBuffer are allowed')
    return method


def _numpy_globals() -> list:
    reconstruct = np.ndarray.__reduce__(np.zeros(0))[0]
    scalar = np.float64(0).__reduce__()[0]
    safe = [np.ndarray, np.dtype, reconstruct, scalar]
    # pickles written with numpy 1.x name numpy.core, numpy 2.x numpy._core
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        safe += [(reconstruct, f'{module}._reconstruct'),
                 (scalar, f'{module}.scalar')]
    # numpy >= 1.25 pickles some dtypes by their class (numpy.dtypes.*)
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        safe += [
            cls for cls in vars(dtypes).values()
            if inspect.isclass(cls) and issubclass(cls, np.dtype)
        ]
    return safe


def register_checkpoint_safe_globals() -> None:
    """Allow the objects mmengine saves in checkpoints under
    ``weights_only=True`` (idempotent)."""
    torch.serialization.add_safe_globals([
        HistoryBuffer,
        (history_buffer_getattr, 'builtins.getattr'),
        *_numpy_globals(),
    ])
