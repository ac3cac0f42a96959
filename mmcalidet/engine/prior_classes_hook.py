# Copyright (c) mmcalidet contributors. All rights reserved.
""":class:`PriorClassesHook`: the training dataset's classes reach the
model before training.

mmengine's runner never sets the model's ``dataset_meta``. A CaliDet
detector built with a named prior (a prior file or shipped name that
records its class names) and without ``classes`` holds that prior in the
file's order until it knows its classes; this hook gives them, so the
prior, and each EdgeSampler's, is reordered to the dataset's class order
(or refused, naming the file, when the names differ) before the first
step. A CaliDet detector refuses to train with a named prior that was
never matched. The CaliDet configs use it through
``configs/_base_/calidet.py``::

    custom_hooks = [dict(type='PriorClassesHook')]
"""
from typing import List, Optional

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper


def dataset_classes(dataset) -> Optional[List[str]]:
    """The class names of a (possibly wrapped) dataset's ``metainfo``.

    Args:
        dataset: an mmengine dataset, or a wrapper of one (its
            ``metainfo``, else its ``dataset``'s).

    Returns:
        list[str] | None: the classes, or ``None`` when it names none.
    """
    while dataset is not None:
        meta = getattr(dataset, 'metainfo', None)
        classes = meta.get('classes') if isinstance(meta, dict) else None
        if classes:
            return list(classes)
        dataset = getattr(dataset, 'dataset', None)
    return None


@HOOKS.register_module()
class PriorClassesHook(Hook):
    """Before training, match the model's named priors to the training
    dataset's classes (``model.match_prior_classes``); nothing for a model
    that has no named priors to match (a plain detector, or classes known
    already)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        """Give the model the training dataset's classes.

        Args:
            runner: the mmengine runner.

        Raises:
            ValueError: a named prior's classes are not the dataset's.
        """
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        match = getattr(model, 'match_prior_classes', None)
        if match is None:
            return
        classes = dataset_classes(runner.train_dataloader.dataset)
        if classes is not None and len(classes) == model.num_classes:
            match(classes)
