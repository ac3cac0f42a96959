# Copyright (c) mmcalidet contributors. All rights reserved.
""":class:`CheckpointCompatHook`: says, before mmengine loads a checkpoint,
what of it does not fit the model (another class count, a plain
detector's checkpoint in a CaliDet model or the reverse).

A config registers it by importing ``mmcalidet.engine.checkpoint_hooks``
(see there) and uses it with::

    custom_hooks = [dict(type='CheckpointCompatHook')]
"""
import logging

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from ..utils.checkpoint_compat import check_checkpoint


@HOOKS.register_module()
class CheckpointCompatHook(Hook):
    """Say what of a checkpoint does not fit the model, before mmengine
    loads it (``load_from``, ``--resume``, ``tools/test.py``); see
    :func:`~mmcalidet.utils.checkpoint_compat.check_checkpoint`.

    - tensors of other shapes (e.g. a checkpoint of another class count):
      an error, unless ``allow_shape_mismatch`` (then a warning);
    - a plain detector's checkpoint (e.g. DINO) in a CaliDet model: a
      warning (fine-tuning from a baseline is the paper's recipe), an
      error unless ``allow_uncalibrated``;
    - a CaliDet checkpoint in a plain detector: a warning that the
      calibration is dropped;
    - other missing tensors: a warning, an error unless ``allow_missing``.

    Resuming requires every tensor to fit. ``tools/train.py`` and
    ``tools/test.py`` add this hook (``tools/test.py`` with
    ``allow_uncalibrated=False, allow_missing=False``) unless the config
    has one.

    Args:
        allow_shape_mismatch (bool): Defaults to False.
        allow_uncalibrated (bool): Defaults to True.
        allow_missing (bool): Defaults to True.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 allow_shape_mismatch: bool = False,
                 allow_uncalibrated: bool = True,
                 allow_missing: bool = True) -> None:
        self.allow_shape_mismatch = allow_shape_mismatch
        self.allow_uncalibrated = allow_uncalibrated
        self.allow_missing = allow_missing

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Compare ``checkpoint['state_dict']`` with the model (the runner
        calls this before it loads the weights).

        Args:
            runner (Runner): the runner.
            checkpoint (dict): the loaded checkpoint.

        Raises:
            CheckpointMismatchError: naming what does not fit.
        """
        state_dict = checkpoint.get('state_dict', checkpoint)
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        strict = bool(getattr(runner, '_resume', False))
        for message in check_checkpoint(
                model,
                state_dict,
                allow_shape_mismatch=self.allow_shape_mismatch and not strict,
                allow_uncalibrated=self.allow_uncalibrated and not strict,
                allow_missing=self.allow_missing and not strict):
            runner.logger.log(logging.WARNING, message)
