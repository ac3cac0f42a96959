# Copyright (c) mmcalidet contributors. All rights reserved.
"""The evaluation's decoder caches: the last decoder layer of each test
image, re-scored under any prior by :mod:`mmcalidet.evaluation.scoring`.

One format and reader serve the evaluation and the calibrator's training
(:mod:`mmcalidet.decoder_cache`); this module names the test-split
fingerprint and keeps the evaluation's import path of the shared API.

Memory: ``Q * (d + 4) * 4`` bytes per image in float32, e.g. DINO-4scale
(Q = 900, d = 256): 0.89 MiB per image, 4.4 GiB for COCO val2017 (5,000
images) and 62 GiB for the filtered Objects365 val (71,316 images). With a
``cache_dir`` the arrays are written there and memory-mapped (and a later
run with the same checkpoint, config and images reuses them);
``float16`` hidden states halve the size (scores then differ from a full
forward by the rounding of ``h``).
"""
from typing import Dict, Optional

import torch

from ..decoder_cache import (DecoderCache, cache_fingerprint,
                             cache_hidden_states, cache_images, image_batches,
                             run_decoder, strip_data_sample, with_predictions)

__all__ = [
    'DecoderCache', 'cache_hidden_states', 'cache_images', 'image_batches',
    'run_decoder', 'strip_data_sample', 'with_predictions', 'eval_fingerprint'
]


def eval_fingerprint(cfg,
                     checkpoint: Optional[str],
                     model: torch.nn.Module,
                     batch_size: int,
                     dtype: str = 'float32') -> Dict:
    """The fingerprint of an evaluation cache: the config's model and test
    set (``indices`` of ``--max-images`` included), the checkpoint file (or
    the model's weights without one), the batch size (the E_b batches),
    the stored type, the last layer.

    Args:
        cfg (Config): the loaded config (overrides applied).
        checkpoint (str, optional): the checkpoint (``None``/``'none'``:
            the model's weights are hashed).
        model (nn.Module): the detector.
        batch_size (int): the test batch size.
        dtype (str): ``'float32'`` or ``'float16'``.

    Returns:
        dict: the fingerprint.
    """
    weights = model if checkpoint in (None, 'none') else checkpoint
    return cache_fingerprint(
        cfg,
        weights,
        split='test',
        batch_size=batch_size,
        dtype=dtype,
        layers='last')
