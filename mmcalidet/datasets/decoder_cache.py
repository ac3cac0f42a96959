# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached decoder outputs of a trained detector, as a training set for the
calibrator (the CaliFormer, optionally the classification branches).

The decoder's hidden states and boxes do not depend on the prior: DINO's
encoder proposal head stays uncalibrated, so ``E`` only reaches the
classification logits ``(W + rho V')^T h + b``. A CaliDet calibrator can
therefore train on the hidden states of every decoder layer, computed once
by a frozen baseline, instead of a full forward/backward of the detector.

A cache is a folder::

    meta.json        what made it (hashes of the config's model and
                     training set and of the checkpoint file, passes) and
                     the shapes
    hidden.npy       (N, L, Q, d) hidden states of every decoder layer
    boxes.npy        (N, L, Q, 4) the head's boxes of every layer
                     (normalised cx, cy, w, h)
    gt_bboxes.npy    (M, 4) ground-truth boxes (x1, y1, x2, y2, pixels of
                     the transformed image), all entries concatenated
    gt_labels.npy    (M,) their classes
    gt_offsets.npy   (N + 1,) entry n owns rows offsets[n]:offsets[n+1]
    metainfo.json    per entry: img_id, img_shape, ... (what the losses
                     read)

The arrays are memory-mapped on load, so a cache larger than memory works.
Size: ``N * L * Q * (d + 4) * itemsize``, e.g. the tiny context-shift DINO
(2,000 images, 2 layers, 30 queries, d = 256) 125 MB in float32; DINO-4scale
on COCO train (117k images, 6 layers, 900 queries) 330 GB in float16: cache
a subset of images (``indices``) there.
"""
import hashlib
import json
import os
import os.path as osp
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from mmdet.registry import DATASETS
from mmdet.structures import DetDataSample
from mmengine.dist import barrier, get_rank
from mmengine.logging import print_log
from mmengine.structures import InstanceData
from torch.utils.data import Dataset

from ..utils.prior_source import model_classes
from ..utils.progress import progress_bar

#: bumped when the folder layout changes (older caches are rebuilt)
CACHE_FORMAT = 1
#: metainfo keys kept per entry (what the DETR losses and matching read)
META_KEYS = ('img_id', 'img_path', 'ori_shape', 'img_shape', 'pad_shape',
             'scale_factor', 'batch_input_shape', 'flip', 'flip_direction')


def checkpoint_fingerprint(checkpoint: str) -> Dict:
    """Size and SHA-1 of a checkpoint file: a cache made from another file
    (or a retrained one at the same path) is stale, the same file copied
    elsewhere is not.

    Args:
        checkpoint (str): the checkpoint file.

    Returns:
        dict: ``size`` and ``sha1``.
    """
    if not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    digest = hashlib.sha1()
    with open(checkpoint, 'rb') as f:
        for block in iter(lambda: f.read(1 << 24), b''):
            digest.update(block)
    return dict(size=os.path.getsize(checkpoint), sha1=digest.hexdigest())


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def config_fingerprint(config: str) -> Dict:
    """A hash of what in a config decides a cache's content: the model and
    the training set (its data, annotation file and pipeline), as parsed
    (``_base_`` and environment variables resolved). The same config at
    another path (another clone, a ``mim`` install) keeps its caches; an
    edited pipeline or another data root makes them stale.

    Args:
        config (str): the detector's config file.

    Returns:
        dict: ``sha1`` of the canonical JSON of those parts.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    parts = dict(
        model=cfg.get('model'),
        train_dataset=cfg.get('train_dataloader', {}).get('dataset'))
    text = json.dumps(parts, sort_keys=True, default=str)
    return dict(sha1=hashlib.sha1(text.encode()).hexdigest())


def source_settings(config: str, checkpoint: str, passes: int,
                    indices: Optional[Sequence[int]],
                    dtype: str) -> Dict:
    """What decides a cache's content, as stored in its ``meta.json``."""
    return dict(
        config=config_fingerprint(config),
        checkpoint=checkpoint_fingerprint(checkpoint),
        passes=int(passes),
        indices=None if indices is None else [int(i) for i in indices],
        dtype=dtype)


def build_decoder_cache(config: str,
                        checkpoint: str,
                        cache_dir: str,
                        passes: int = 1,
                        indices: Optional[Sequence[int]] = None,
                        batch_size: int = 8,
                        dtype: str = 'float32',
                        device: str = 'cpu',
                        progress: bool = True) -> str:
    """Run a trained detector over its training set (the config's
    ``train_dataloader.dataset``, training pipeline) and cache the hidden
    states and boxes of every decoder layer with the ground truth.

    The detector runs in eval mode (no denoising queries, batch-norm
    statistics frozen). With a random training pipeline, each of
    ``passes`` passes sees other augmentations. The folder is written
    under a temporary name and renamed when complete, so an interrupted
    run leaves no half cache.

    Args:
        config (str): the detector's config (a plain DINO or a CaliDINO).
        checkpoint (str): its trained checkpoint.
        cache_dir (str): the cache folder to write (replaced).
        passes (int): passes over the training set. Defaults to 1.
        indices (Sequence[int], optional): cache only these images of the
            training set.
        batch_size (int): images per forward. Defaults to 8.
        dtype (str): ``'float32'`` or ``'float16'`` (hidden states).
        device (str): where the detector runs.
        progress (bool): show a progress bar.

    Returns:
        str: ``cache_dir``.
    """
    from mmengine.dataset import pseudo_collate

    from ..apis.inference import init_detector
    from ..evaluation.cache import run_decoder
    if passes < 1:
        raise ValueError(f'passes must be >= 1, got {passes}')
    if dtype not in ('float32', 'float16'):
        raise ValueError(f'dtype must be float32 or float16, got {dtype!r}')
    settings = source_settings(config, checkpoint, passes, indices, dtype)
    model = init_detector(config, checkpoint, device=device)
    model.eval()
    dataset = DATASETS.build(model.cfg.train_dataloader.dataset)
    order = list(range(len(dataset))) if indices is None else \
        [int(i) for i in indices]
    if not order:
        raise ValueError(f'{config}: the training set is empty')
    bad = [i for i in order if not 0 <= i < len(dataset)]
    if bad:
        raise ValueError(f'indices out of range for the training set of '
                         f'{len(dataset)} images: {bad[:5]}')
    entries = order * passes
    parent = osp.dirname(osp.abspath(cache_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(
        prefix='.' + osp.basename(cache_dir) + '.partial-', dir=parent)
    try:
        hidden_map = boxes_map = None
        gt_bboxes: List[np.ndarray] = []
        gt_labels: List[np.ndarray] = []
        metainfo: List[Dict] = []
        bar = progress_bar(
            desc='decoder cache (train)',
            enabled=progress,
            total=len(entries),
            unit='img',
            leave=True)
        with torch.no_grad(), bar:
            for start in range(0, len(entries), batch_size):
                items = [
                    dataset[i] for i in entries[start:start + batch_size]
                ]
                samples, hidden, (_, boxes) = run_decoder(
                    model, pseudo_collate(items))  # hidden: (L, B, Q, d)
                if hidden_map is None:
                    num_layers, _, num_queries, dims = hidden.shape
                    hidden_map = np.lib.format.open_memmap(
                        osp.join(tmp, 'hidden.npy'),
                        mode='w+',
                        dtype=dtype,
                        shape=(len(entries), num_layers, num_queries, dims))
                    boxes_map = np.lib.format.open_memmap(
                        osp.join(tmp, 'boxes.npy'),
                        mode='w+',
                        dtype='float32',
                        shape=(len(entries), num_layers, num_queries, 4))
                stop = start + len(samples)
                hidden_map[start:stop] = hidden.transpose(
                    0, 1).cpu().numpy().astype(dtype)
                boxes_map[start:stop] = boxes.transpose(
                    0, 1).float().cpu().numpy()
                for ds in samples:
                    gt = ds.gt_instances
                    bboxes = gt.bboxes
                    bboxes = getattr(bboxes, 'tensor', bboxes)
                    gt_bboxes.append(
                        bboxes.detach().cpu().numpy().astype(np.float32))
                    gt_labels.append(
                        gt.labels.detach().cpu().numpy().astype(np.int64))
                    metainfo.append({
                        k: _jsonable(ds.metainfo[k])
                        for k in META_KEYS if k in ds.metainfo
                    })
                bar.update(len(samples))
        hidden_map.flush()
        boxes_map.flush()
        del hidden_map, boxes_map
        offsets = np.zeros(len(entries) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(lab) for lab in gt_labels])
        np.save(
            osp.join(tmp, 'gt_bboxes.npy'),
            np.concatenate(gt_bboxes).reshape(-1, 4)
            if gt_bboxes else np.zeros((0, 4), np.float32))
        np.save(
            osp.join(tmp, 'gt_labels.npy'),
            np.concatenate(gt_labels)
            if gt_labels else np.zeros(0, np.int64))
        np.save(osp.join(tmp, 'gt_offsets.npy'), offsets)
        with open(osp.join(tmp, 'metainfo.json'), 'w') as f:
            json.dump(metainfo, f)
        classes = model_classes(model)
        with open(osp.join(tmp, 'meta.json'), 'w') as f:
            json.dump(
                dict(
                    format=CACHE_FORMAT,
                    source=settings,
                    config_path=osp.abspath(config),
                    checkpoint_path=osp.abspath(checkpoint),
                    num_entries=len(entries),
                    num_layers=int(hidden.shape[0]),
                    classes=list(classes) if classes else None),
                f,
                indent=1)
        if osp.isdir(cache_dir):
            shutil.rmtree(cache_dir)
        os.rename(tmp, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cache_dir


def read_cache_meta(cache_dir: str) -> Optional[Dict]:
    """The ``meta.json`` of a complete cache, else ``None``."""
    path = osp.join(cache_dir, 'meta.json')
    if not osp.isfile(path):
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def stale_reasons(cache_dir: str, config: str, checkpoint: str, passes: int,
                  indices: Optional[Sequence[int]], dtype: str) -> List[str]:
    """Why ``cache_dir`` does not hold a complete cache of this source.

    Args:
        cache_dir (str): the cache folder.
        config (str): the detector's config file.
        checkpoint (str): its checkpoint.
        passes (int): passes over the training set.
        indices (Sequence[int], optional): the cached images.
        dtype (str): the stored dtype.

    Returns:
        list[str]: empty when the cache is current; else ``'no complete
        cache'``, ``'another cache format'``, or ``'KEY changed'`` for
        each setting that differs from the cache's (``config``,
        ``checkpoint``, ``passes``, ``indices``, ``dtype``).
    """
    meta = read_cache_meta(cache_dir)
    if meta is None:
        return ['no complete cache']
    if meta.get('format') != CACHE_FORMAT:
        return ['another cache format']
    wanted = json.loads(
        json.dumps(
            source_settings(config, checkpoint, passes, indices, dtype)))
    made = meta.get('source') or {}
    return [f'{key} changed' for key in wanted if made.get(key) != wanted[key]]


def stale_message(cache_dir: str, reasons: Sequence[str]) -> Optional[str]:
    """What to tell a user whose cache folder is made again, or ``None``
    where there is no folder yet (a first cache needs no reason).

    Args:
        cache_dir (str): the cache folder.
        reasons (Sequence[str]): :func:`stale_reasons`' answer.

    Returns:
        str, optional: ``'DIR: REASONS; making it again'``.
    """
    if not reasons or not osp.isdir(cache_dir):
        return None
    return f'{cache_dir}: {", ".join(reasons)}; making it again'


def cache_is_current(cache_dir: str, config: str, checkpoint: str,
                     passes: int, indices: Optional[Sequence[int]],
                     dtype: str) -> bool:
    """Whether ``cache_dir`` holds a complete cache of this source."""
    return not stale_reasons(cache_dir, config, checkpoint, passes, indices,
                             dtype)


@DATASETS.register_module()
class DecoderCacheDataset(Dataset):
    """Cached decoder outputs (every decoder layer) with the ground truth,
    for training a calibrator on a frozen detector.

    Each item is ``dict(inputs=dict(hidden_states=(L, Q, d), bbox_preds=(L,
    Q, 4)), data_samples=DetDataSample)`` with ``gt_instances`` and the
    metainfo the losses read; :class:`DecoderCachePreprocessor` batches
    them and draws the priors.

    Args:
        cache_dir (str): the cache folder.
        source (dict, optional): how to make the cache when the folder is
            missing or stale: ``config`` and ``checkpoint`` of the trained
            detector, and optionally ``passes``, ``indices``,
            ``batch_size``, ``dtype``, ``device``, ``progress`` (see
            :func:`build_decoder_cache`). Without it the folder must exist.
        metainfo (dict, optional): dataset metainfo (``classes``);
            defaults to the classes stored in the cache.
    """

    def __init__(self,
                 cache_dir: str,
                 source: Optional[Dict] = None,
                 metainfo: Optional[Dict] = None) -> None:
        super().__init__()
        self.cache_dir = cache_dir
        if source is not None:
            self._ensure(dict(source))
        meta = read_cache_meta(cache_dir)
        if meta is None:
            raise FileNotFoundError(
                f'no decoder cache in {cache_dir}: give the dataset a '
                '`source=dict(config=..., checkpoint=...)` to make it, or '
                'run tools/analysis_tools/cache_decoder_outputs.py')
        self.meta = meta
        self.hidden = np.load(osp.join(cache_dir, 'hidden.npy'), mmap_mode='r')
        self.boxes = np.load(osp.join(cache_dir, 'boxes.npy'), mmap_mode='r')
        self.gt_bboxes = np.load(osp.join(cache_dir, 'gt_bboxes.npy'))
        self.gt_labels = np.load(osp.join(cache_dir, 'gt_labels.npy'))
        self.gt_offsets = np.load(osp.join(cache_dir, 'gt_offsets.npy'))
        with open(osp.join(cache_dir, 'metainfo.json')) as f:
            self.img_metas = json.load(f)
        n = len(self.hidden)
        if not (len(self.boxes) == n == len(self.img_metas) ==
                len(self.gt_offsets) - 1):
            raise ValueError(f'{cache_dir}: the cache files disagree on '
                             'the number of entries; delete the folder to '
                             'make it again')
        self._metainfo = dict(metainfo or {})
        if 'classes' not in self._metainfo and meta.get('classes'):
            self._metainfo['classes'] = tuple(meta['classes'])

    def _ensure(self, source: Dict) -> None:
        for key in ('config', 'checkpoint'):
            if key not in source:
                raise ValueError(f'DecoderCacheDataset: source needs '
                                 f'{key!r}, got {sorted(source)}')
        passes = int(source.get('passes', 1))
        indices = source.get('indices')
        dtype = source.get('dtype', 'float32')
        reasons = stale_reasons(self.cache_dir, source['config'],
                                source['checkpoint'], passes, indices,
                                dtype) if get_rank() == 0 else []
        if reasons:
            message = stale_message(self.cache_dir, reasons)
            if message:
                print_log(f'decoder cache {message}', logger='current')
            build_decoder_cache(
                source['config'],
                source['checkpoint'],
                self.cache_dir,
                passes=passes,
                indices=indices,
                batch_size=int(source.get('batch_size', 8)),
                dtype=dtype,
                device=source.get('device', 'cpu'),
                progress=bool(source.get('progress', True)))
        barrier()

    @property
    def metainfo(self) -> Dict:
        """Dataset metainfo (``classes``), as mmengine datasets have."""
        return dict(self._metainfo)

    @property
    def num_layers(self) -> int:
        """L, the cached decoder layers."""
        return int(self.hidden.shape[1])

    def __len__(self) -> int:
        return len(self.hidden)

    def __getitem__(self, index: int) -> Dict[str, Union[Dict, DetDataSample]]:
        lo, hi = self.gt_offsets[index], self.gt_offsets[index + 1]
        sample = DetDataSample(metainfo=dict(self.img_metas[index]))
        gt = InstanceData()
        gt.bboxes = torch.from_numpy(np.array(self.gt_bboxes[lo:hi]))
        gt.labels = torch.from_numpy(np.array(self.gt_labels[lo:hi]))
        sample.gt_instances = gt
        inputs = dict(
            hidden_states=torch.from_numpy(
                np.array(self.hidden[index], dtype=np.float32)),
            bbox_preds=torch.from_numpy(np.array(self.boxes[index])))
        return dict(inputs=inputs, data_samples=sample)
