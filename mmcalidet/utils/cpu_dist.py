# Copyright (c) mmcalidet contributors. All rights reserved.
"""Multi-process training and testing on machines without GPUs."""
import datetime

import torch
import torch.distributed as dist


def init_cpu_distributed(cfg) -> bool:
    """Start the gloo process group for ``--launcher pytorch`` on a machine
    without GPUs, before the Runner is built.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP
    wrapper passes ``device_ids=[LOCAL_RANK]``; both fail on CPU. When the
    process group exists, the Runner skips ``init_dist``; DDP then gets
    ``device_ids=None`` (mmengine's other defaults kept). Nothing happens
    with GPUs, without a launcher, or when the group exists already.

    Args:
        cfg (Config): the config; ``cfg.launcher`` is read and
            ``cfg.model_wrapper_cfg`` set.

    Returns:
        bool: whether the process group was started here.

    Raises:
        RuntimeError: for the ``slurm`` and ``mpi`` launchers on CPU.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available() or \
            dist.is_initialized():
        return False
    if launcher != 'pytorch':
        raise RuntimeError(
            f'--launcher {launcher} needs GPUs; on CPU, start the '
            'processes with torchrun (tools/dist_train.sh), i.e. '
            '--launcher pytorch')
    timeout = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('timeout')
    dist.init_process_group(
        backend='gloo',
        timeout=datetime.timedelta(seconds=timeout) if timeout else None)
    wrapper = cfg.get('model_wrapper_cfg', None) or dict(
        type='MMDistributedDataParallel',
        broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    return True
