# Copyright (c) mmcalidet contributors. All rights reserved.
"""A prior checked against a detector's config before anything is built:
the tools refuse a prior of another K before a runner writes its work_dir.
"""
from typing import Any, Optional

from ..priors.prior import Prior


def config_num_classes(model_cfg: Any) -> Optional[int]:
    """The K a detector config states: its ``bbox_head`` (one-stage,
    DETR) or ``roi_head.bbox_head`` (two-stage; the last stage of a
    cascade) ``num_classes``, else ``None``.

    Args:
        model_cfg (dict | ConfigDict): the config's ``model``.

    Returns:
        int | None: K.
    """
    if not isinstance(model_cfg, dict):
        return None
    heads = [model_cfg.get('bbox_head')]
    roi_head = model_cfg.get('roi_head')
    if isinstance(roi_head, dict):
        head = roi_head.get('bbox_head')
        if isinstance(head, (list, tuple)):  # a cascade: its last stage
            head = head[-1] if head else None
        heads.append(head)
    for head in heads:
        if isinstance(head, dict) and isinstance(head.get('num_classes'), int):
            return head['num_classes']
    return None


def check_prior_for_config(prior: Any, cfg: Any) -> Prior:
    """Load ``prior`` and check its K against the config's, before a model
    or a runner is built.

    Args:
        prior: a prior file, a shipped name, a dict or a matrix.
        cfg (Config): the detector config.

    Returns:
        Prior: the loaded prior.

    Raises:
        ValueError: a bad prior (:meth:`Prior.load`), or one of another K
            than the config's model.
    """
    loaded = Prior.load(prior)
    k = config_num_classes(cfg.get('model'))
    if k is not None and loaded.num_classes != k:
        raise ValueError(f'{loaded.name} has K={loaded.num_classes} classes, '
                         f'the model of the config has {k}')
    return loaded
