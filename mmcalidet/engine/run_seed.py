# Copyright (c) mmcalidet contributors. All rights reserved.
"""The seed of a run, kept across an interruption.

A config without ``randomness.seed`` gets a random seed from mmengine,
recorded in every checkpoint (``meta['seed']``). mmengine restores it on
resume, but only after the data loader was built: the sampler's shuffle
order and the workers' seeds keep the new run's seed, so a resumed run
draws other batches than the uninterrupted one. :func:`restore_run_seed`
reads the seed from the checkpoint to resume *before* anything is built,
so that everything is seeded as in the interrupted run.
"""
import os.path as osp
from typing import Optional

from mmengine.config import Config


def checkpoint_to_resume(cfg: Config) -> Optional[str]:
    """The checkpoint a config resumes from: ``load_from`` with
    ``resume=True``, else the work dir's latest (mmengine's
    ``last_checkpoint`` record), else ``None``.

    Args:
        cfg (Config): the training config (``resume`` set).

    Returns:
        str | None: the checkpoint path.
    """
    from mmengine.runner import find_latest_checkpoint
    if not cfg.get('resume', False):
        return None
    if cfg.get('load_from'):
        return cfg.load_from
    work_dir = cfg.get('work_dir')
    if not work_dir or not osp.isdir(work_dir):
        return None
    return find_latest_checkpoint(work_dir)


def restore_run_seed(cfg: Config) -> Optional[int]:
    """With ``resume`` and no ``randomness.seed``, set the config's seed to
    the one the interrupted run used (its checkpoint's ``meta['seed']``).

    A resumed run then repeats the uninterrupted one (with
    :class:`~mmcalidet.engine.IterationSeedHook`, bit-identical on CPU)
    whether or not the config names a seed. An explicit seed is left as
    it is (mmengine warns when it differs from the checkpoint's).

    Args:
        cfg (Config): the training config, changed in place.

    Returns:
        int | None: the restored seed, or ``None`` when nothing changed.
    """
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') is not None:
        return None
    checkpoint = checkpoint_to_resume(cfg)
    if checkpoint is None or not osp.isfile(checkpoint):
        return None
    from ..utils.checkpoint import read_checkpoint_mapped
    meta = read_checkpoint_mapped(checkpoint).get('meta') or {}
    seed = meta.get('seed')
    if seed is None:
        return None
    cfg.randomness = dict(randomness, seed=int(seed))
    return int(seed)
