# Copyright (c) mmcalidet contributors. All rights reserved.
"""What decides a decoder cache's content: the config's model and the
cached split's data (pipeline included), the weights (checkpoint size and
SHA-1), passes, seed, images, batch size, stored type and layers. Equal
fingerprints mean equal caches; a cache folder records its own."""
import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence, Union

import torch

#: the decoder layers a cache can hold
LAYERS = ('all', 'last')


def checkpoint_fingerprint(checkpoint: str) -> Dict:
    """Size and SHA-1 of a checkpoint file: a cache made from another file
    (or a retrained one at the same path) is stale, the same file copied
    elsewhere is not.

    Args:
        checkpoint (str): the checkpoint file.

    Returns:
        dict: ``size`` and ``sha1``.
    """
    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    digest = hashlib.sha1()
    with open(checkpoint, 'rb') as f:
        for block in iter(lambda: f.read(1 << 24), b''):
            digest.update(block)
    return dict(size=os.path.getsize(checkpoint), sha1=digest.hexdigest())


def weights_fingerprint(model: torch.nn.Module) -> Dict:
    """SHA-1 of a model's state dict, for a model without a checkpoint
    file (random weights in smoke tests and benchmarks).

    Args:
        model (nn.Module): the model.

    Returns:
        dict: ``weights_sha1``.
    """
    digest = hashlib.sha1()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return dict(weights_sha1=digest.hexdigest())


def config_fingerprint(config, split: str = 'train') -> Dict:
    """A hash of what in a config decides a cache's content: the model and
    the cached split's dataset (data, annotation file, pipeline,
    ``indices``), as parsed (``_base_`` and environment variables
    resolved). The same config at another path keeps its caches; an
    edited pipeline or another data root makes them stale.

    Args:
        config (str | Config): the detector's config (file or loaded).
        split (str): ``'train'``, ``'val'`` or ``'test'``.

    Returns:
        dict: ``sha1`` of the canonical JSON of those parts.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    loader = cfg.get(f'{split}_dataloader', None) or {}
    parts = dict(model=cfg.get('model'), dataset=loader.get('dataset'))
    text = json.dumps(parts, sort_keys=True, default=str)
    return dict(sha1=hashlib.sha1(text.encode()).hexdigest())


def cache_fingerprint(config,
                      weights: Union[str, torch.nn.Module, None],
                      split: str = 'train',
                      passes: int = 1,
                      indices: Optional[Sequence[int]] = None,
                      batch_size: int = 1,
                      dtype: str = 'float32',
                      layers: str = 'all',
                      seed: Optional[int] = None) -> Dict:
    """The fingerprint a cache of this source records in its meta file.

    Args:
        config (str | Config): the detector's config.
        weights (str | nn.Module): its checkpoint file, or the model itself
            when it has none (its state dict is hashed).
        split (str): the cached split of the config.
        passes (int): passes over the images.
        indices (Sequence[int], optional): the cached images of the split.
        batch_size (int): images per forward (padding to a batch's largest
            image changes the features; evaluation batches are the E_b
            batches).
        dtype (str): stored type of the hidden states.
        layers (str): ``'all'`` decoder layers or the ``'last'``.
        seed (int, optional): random seed of the passes.

    Returns:
        dict: JSON-ready fingerprint.
    """
    if layers not in LAYERS:
        raise ValueError(f'layers must be one of {LAYERS}, got {layers!r}')
    if isinstance(weights, str):
        source = checkpoint_fingerprint(weights)
    elif isinstance(weights, torch.nn.Module):
        source = weights_fingerprint(weights)
    else:
        raise ValueError('a cache fingerprint needs a checkpoint or a model')
    return dict(
        config=config_fingerprint(config, split),
        checkpoint=source,
        split=split,
        passes=int(passes),
        indices=None if indices is None else [int(i) for i in indices],
        batch_size=int(batch_size),
        dtype=str(dtype),
        layers=layers,
        seed=None if seed is None else int(seed))


def fingerprint_digest(fingerprint: Dict) -> str:
    """A short hex digest of a fingerprint (cache folder names)."""
    text = json.dumps(fingerprint, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def fingerprint_changes(made: Optional[Dict], wanted: Dict) -> List[str]:
    """``'KEY changed'`` for each entry of ``wanted`` that ``made`` (a
    cache's recorded fingerprint) holds otherwise."""
    made = made or {}
    wanted = json.loads(json.dumps(wanted))
    return [f'{key} changed' for key in wanted if made.get(key) != wanted[key]]
