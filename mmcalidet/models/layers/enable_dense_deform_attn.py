# Copyright (c) mmcalidet contributors. All rights reserved.
"""Importing this module makes mmcv's multi-scale deformable attention
compute its CPU path as one dense matrix product where that is small
(:mod:`mmcalidet.models.layers.dense_deform_attn`). Configs opt in with::

    custom_imports = dict(
        imports=['mmcalidet.models.layers.enable_dense_deform_attn'],
        allow_failed_imports=False)

as the tiny CPU configs do; the result is mmcv's (float rounding aside),
about 5x faster on 128-px images (``benchmarks/bench_train_step.py``).
"""
from .dense_deform_attn import use_dense_deform_attn

use_dense_deform_attn(True)
