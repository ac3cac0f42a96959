# Copyright (c) mmcalidet contributors. All rights reserved.
"""Importing this module makes mmcv's multi-scale deformable attention
compute its CPU path with mmcalidet's compiled kernel
(:mod:`mmcalidet.models.layers.cpu_deform_attn`). Configs opt in with::

    custom_imports = dict(
        imports=['mmcalidet.models.layers.enable_cpu_deform_attn'],
        allow_failed_imports=False)

as the tiny CPU configs do; the result is mmcv's (float rounding aside),
computed several times faster (``benchmarks/bench_train_step.py
--compare-attention``).
"""
from .cpu_deform_attn import use_cpu_deform_attn

use_cpu_deform_attn(True)
