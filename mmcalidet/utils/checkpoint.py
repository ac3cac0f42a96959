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
import os
import os.path as osp
import pickle
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from .checkpoint_compat import CheckpointError, check_checkpoint
from .file_io import check_readable_file


class CheckpointReadError(CheckpointError):
    """A checkpoint file cannot be read: missing, empty, truncated or not a
    checkpoint."""


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


def _one_line(exc: BaseException) -> str:
    """The gist of a ``torch.load`` error, on one line."""
    text = str(exc)
    if 'WeightsUnpickler error:' in text:  # torch's text around the reason
        text = text.split('WeightsUnpickler error:', 1)[1]
        text = text.split('Check the documentation', 1)[0]
    elif 'PytorchStreamReader' in text:
        text = text.split('. This is an internal', 1)[0]
    text = ' '.join(text.split())
    if len(text) > 200:
        text = text[:197] + '...'
    return f'{type(exc).__name__}: {text}' if text else type(exc).__name__


def check_checkpoint_readable(filename: str) -> str:
    """Refuse a missing, empty or non-regular (FIFO, device) checkpoint
    file without reading it.

    Args:
        filename (str): the checkpoint file (``~`` is expanded).

    Returns:
        str: the expanded file name.

    Raises:
        CheckpointReadError: naming the file and the problem.
    """
    filename = osp.expanduser(os.fspath(filename))
    try:
        check_readable_file(filename, max_bytes=1 << 62, what='checkpoint')
    except ValueError as exc:
        raise CheckpointReadError(str(exc)) from exc
    return filename


def load_checkpoint_file(filename: str,
                         map_location: Optional[Any] = None) -> Any:
    """``torch.load`` a local checkpoint, with errors that name the file.

    mmengine's local loader lets a missing, empty, truncated or foreign
    file through to ``torch.load``, whose errors (an ``EOFError`` without a
    message, a ``RuntimeError`` of the zip reader, a weights-only
    unpickling error of many lines) do not say which file or what is
    wrong, and a FIFO or device file blocks it or fills the memory. Here a
    non-regular or empty file is refused before reading and a failing load
    becomes one line.

    Args:
        filename (str): the checkpoint file (``~`` is expanded).
        map_location: passed to ``torch.load``.

    Returns:
        The loaded checkpoint.

    Raises:
        CheckpointReadError: naming the file and the problem.
    """
    filename = check_checkpoint_readable(filename)
    try:
        return torch.load(filename, map_location=map_location)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise CheckpointReadError(
            f'checkpoint {filename} is truncated, corrupt or not a '
            f'checkpoint ({_one_line(exc)})') from exc


def load_from_local_checked(filename: str, map_location: Any = None) -> Any:
    """mmengine's loader of local files, with :func:`load_checkpoint_file`'s
    checks (registered by :func:`register_checkpoint_loader`)."""
    return load_checkpoint_file(filename, map_location)


def register_checkpoint_loader() -> None:
    """Make mmengine load local checkpoints with
    :func:`load_checkpoint_file` (``load_from``, ``resume``,
    ``load_checkpoint``, ``init_detector``, the inferencers); idempotent."""
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_checked, force=True)


def name_checkpoint(exc: CheckpointError,
                    filename: Optional[str]) -> CheckpointError:
    """``exc`` with the checkpoint file named in its message (``checkpoint
    has ...`` becomes ``checkpoint <file> has ...``), of the same type, to
    raise ``from exc``; ``exc`` itself if it names the file already."""
    if filename is None or os.fspath(filename) in str(exc):
        return exc
    filename = os.fspath(filename)
    text = str(exc)
    if text.startswith('checkpoint '):
        return type(exc)(f'checkpoint {filename} {text[11:]}')
    return type(exc)(f'checkpoint {filename}: {text}')


def read_checkpoint_mapped(filename: Union[str, os.PathLike]) -> dict:
    """The checkpoint dict, memory-mapped when it is a local zip file (so
    reading it beside mmdet's own load costs little).

    Args:
        filename (str | PathLike): the checkpoint (a local file or a URL).

    Returns:
        dict: the checkpoint.

    Raises:
        CheckpointReadError: when it cannot be read or is not a dict.
    """
    filename = os.fspath(filename)
    checkpoint = None
    if osp.isfile(filename):
        try:
            checkpoint = torch.load(filename, map_location='cpu', mmap=True)
        except Exception:  # not a zip checkpoint: no mmap
            checkpoint = None
    if checkpoint is None:
        checkpoint = CheckpointLoader.load_checkpoint(
            filename, map_location='cpu', logger='silent')
    if not isinstance(checkpoint, dict):
        raise CheckpointReadError(
            f'checkpoint {filename} holds a {type(checkpoint).__name__}'
            ', not a dict of tensors')
    return checkpoint


def checkpoint_names_classes(checkpoint: Optional[dict]) -> bool:
    """Whether a checkpoint's meta names its classes (``dataset_meta`` with
    ``classes``, or mmdet 2.x's ``CLASSES``), as runner checkpoints do; a
    hand-saved ``dict(state_dict=...)`` does not, and mmdet's
    ``init_detector`` then names COCO's classes.

    Args:
        checkpoint (dict, optional): the checkpoint's contents
            (:func:`read_checkpoint_mapped`); ``None``: no checkpoint.

    Returns:
        bool: True when the meta names the classes.
    """
    meta = (checkpoint or {}).get('meta') or {}
    dataset_meta = {
        str(k).lower(): v
        for k, v in (meta.get('dataset_meta') or {}).items()
    }
    return bool(dataset_meta.get('classes') or meta.get('CLASSES'))


def check_checkpoint_fits(model: torch.nn.Module, checkpoint: dict,
                          filename: str) -> None:
    """Check that a checkpoint fits ``model`` as ``tools/test.py`` does:
    no tensor of another shape (e.g. another class count), no plain
    detector's checkpoint in a CaliDet model, no missing tensor.

    For the entry points that load a checkpoint through mmdet (which only
    logs what does not fit): ``init_detector`` and ``CaliDetInferencer``
    call it (through :func:`build_with_checked_checkpoint`) after loading.

    Args:
        model (nn.Module): the model the checkpoint was loaded into.
        checkpoint (dict): the checkpoint's contents.
        filename (str): its file, named in the errors.

    Raises:
        CheckpointError: naming the file and what does not fit.
    """
    try:
        check_checkpoint(
            model,
            checkpoint.get('state_dict', checkpoint),
            allow_shape_mismatch=False,
            allow_uncalibrated=False,
            allow_missing=False)
    except CheckpointError as exc:
        raise name_checkpoint(exc, os.fspath(filename)) from exc


def build_with_checked_checkpoint(
        build: Callable[[Optional[str], Optional[dict]], torch.nn.Module],
        checkpoint: Optional[str]) -> torch.nn.Module:
    """``build(checkpoint, contents)`` (a model loader such as mmdet's
    ``init_detector``), then the checks of ``tools/test.py``.

    The checkpoint is read here once, memory-mapped where it is a local
    zip file, and the same contents serve ``build`` (e.g. to read the
    class names in its meta) and the checks; ``build`` loads the weights
    from the file as mmdet does. A checkpoint that does not fit the model
    (another class count, a plain detector's in a CaliDet model, missing
    tensors), has an invalid prior or cannot be read is an error naming
    the file; mmdet's loaders only log the tensors that do not fit. A
    checkpoint that makes ``build`` fail before it can be checked (e.g.
    its ``dataset_meta`` of other classes reaching the model's named
    priors) is checked against a model built without it, so what is wrong
    with the checkpoint is the error.

    Args:
        build (Callable): ``build(checkpoint, contents)`` builds the model,
            loading the checkpoint file it is given (``None``: none);
            ``contents`` is the checkpoint dict (``None`` without one).
        checkpoint (str, optional): the checkpoint file.

    Returns:
        torch.nn.Module: the model ``build`` returned.

    Raises:
        CheckpointError: naming the checkpoint file and the problem.
    """
    contents = None
    if checkpoint is not None:
        try:
            contents = read_checkpoint_mapped(checkpoint)
        except CheckpointError as exc:
            raise name_checkpoint(exc, checkpoint) from exc
    try:
        model = build(checkpoint, contents)
    except CheckpointError as exc:
        raise name_checkpoint(exc, checkpoint) from exc
    except ValueError:
        if checkpoint is None:
            raise
        check_checkpoint_fits(build(None, None), contents, checkpoint)
        raise
    if checkpoint is not None:
        check_checkpoint_fits(model, contents, checkpoint)
    return model
