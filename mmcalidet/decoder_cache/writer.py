# Copyright (c) mmcalidet contributors. All rights reserved.
"""Writing a decoder cache: in memory, or into a private partial folder
renamed into place when complete (so a reader never sees a half cache
and two runs never write into the same folder)."""
import errno
import hashlib
import json
import os
import os.path as osp
import shutil
import weakref
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.logging import print_log
from torch import Tensor

from ..utils.cache_kinds import TARGET_HEADS, CacheError
from ..utils.progress import progress_bar
from .fingerprint import LAYERS
from .folder_format import CACHE_FORMAT, META_FILE, METAINFO_FILE
from .npy import NpyAppender
from .private_folders import PRIVATE_NAME, private_folder, remove_stale_folders
from .samples import gt_arrays, metainfo_record
from .store import DecoderCache


def _jsonable_fingerprint(fingerprint: Optional[Dict]) -> Optional[Dict]:
    return None if fingerprint is None else json.loads(json.dumps(fingerprint))


class DecoderCacheWriter:
    """Collect a detector's decoder outputs batch by batch into one
    :class:`DecoderCache`.

    Without ``target`` and ``spill_dir`` the arrays stay in memory. With
    ``target`` they are written into a private partial folder beside it,
    renamed to ``target`` on :meth:`commit` (a complete cache already
    there with the same fingerprint is kept; any other is replaced by the
    rename, so a reader mapping it keeps its files). With ``spill_dir``
    only, the cache lives in a private folder there that is removed when
    the returned cache is garbage-collected (or, after a crash, by the
    next build in that folder). A full disk raises one ``OSError``
    naming the folder; a failed build removes its partial folder.

    Args:
        target (str, optional): the cache folder to make.
        fingerprint (dict, optional): what makes the cache (recorded).
        dtype (str | torch.dtype): stored type of the hidden states
            (``float32`` or ``float16``); boxes are float32.
        layers (str): keep ``'all'`` decoder layers or the ``'last'``.
        classes (Sequence[str], optional): the detector's classes.
        info (dict, optional): extra ``meta.json`` entries (paths).
        spill_dir (str, optional): see above.
    """

    def __init__(self,
                 target: Optional[str] = None,
                 fingerprint: Optional[Dict] = None,
                 dtype='float32',
                 layers: str = 'all',
                 classes: Optional[Sequence[str]] = None,
                 info: Optional[Dict] = None,
                 spill_dir: Optional[str] = None) -> None:
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).replace('torch.', '')
        if dtype not in ('float32', 'float16'):
            raise ValueError(f'cache dtype must be float32 or float16, got '
                             f'{dtype}')
        if layers not in LAYERS:
            raise ValueError(f'layers must be one of {LAYERS}, got '
                             f'{layers!r}')
        if target is not None and osp.exists(target) and \
                not osp.isdir(target):
            raise ValueError(f'decoder cache folder {target} is a file, not '
                             'a folder')
        # through a symlink, the folder it points to (the link stays)
        self.target = None if target is None else osp.realpath(target)
        self.fingerprint = _jsonable_fingerprint(fingerprint)
        self.dtype = dtype
        self.layers = layers
        self.classes = list(classes) if classes else None
        self.info = dict(info or {})
        self._files: Dict[str, NpyAppender] = {}
        self._chunks: Dict[str, List[np.ndarray]] = dict(
            hidden=[], boxes=[], targets=[])
        # 'decoder', or 'dense' / 'roi' (targets given), set by the first
        # add
        self._head: Optional[str] = None
        self._gt_bboxes: List[np.ndarray] = []
        self._gt_labels: List[np.ndarray] = []
        self._metainfo: List[Dict] = []
        self._batch_ids: List[int] = []
        self._shape: Optional[tuple] = None  # (L, Q, d)
        self._done = False
        self._committed = False
        self.folder: Optional[str] = None
        if self.target is not None:
            parent = osp.dirname(self.target)
            self.folder = private_folder(parent, osp.basename(self.target))
        elif spill_dir is not None:
            parent = osp.abspath(spill_dir)
            self.folder = private_folder(parent, 'decoder_cache')
        if self.folder is not None:
            self._guard_io(lambda: os.makedirs(parent, exist_ok=True))
            for path in remove_stale_folders(parent):
                print_log(
                    f'removed the stale decoder cache folder {path}',
                    logger='current')
            self._guard_io(lambda: os.makedirs(self.folder))

    def __len__(self) -> int:
        return len(self._batch_ids)

    def __enter__(self) -> 'DecoderCacheWriter':
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def _guard_io(self, fn):
        """Run ``fn``; a full disk becomes one error naming the folder."""
        try:
            return fn()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            where = self.target or self.folder
            self.abort()
            raise OSError(
                errno.ENOSPC, f'no space left on the device for the decoder '
                f'cache {where} (the partial folder was removed)') from None

    def add(self,
            hidden: Tensor,
            boxes: Tensor,
            data_samples: Sequence[DetDataSample],
            batch_id: int,
            targets: Optional[Tensor] = None,
            head: str = 'dense') -> None:
        """Append a batch, as :func:`~.build.run_decoder` (or, for a dense
        head, :func:`~mmcalidet.decoder_cache.dense.run_dense_head`) gives
        it.

        Args:
            hidden (Tensor): (L, B, Q, d) every decoder layer's hidden
                states (a dense head's: L = 1, its cached locations).
            boxes (Tensor): (L, B, Q, 4) their boxes (normalised cxcywh).
            data_samples (Sequence[DetDataSample]): the batch's samples.
            batch_id (int): the data-loader batch index.
            targets (Tensor, optional): (B, Q, 4) a dense head's location
                targets (level, label, score, weight); given for every
                batch of a dense cache, for none of a decoder cache.
            head (str): the kind of a cache with targets: ``'dense'``
                (a one-stage head's locations) or ``'roi'`` (a box head's
                sampled RoIs, :mod:`~mmcalidet.decoder_cache.roi`).
        """
        if hidden.dim() != 4 or tuple(boxes.shape) != tuple(
                hidden.shape[:3]) + (4, ) or \
                len(data_samples) != hidden.shape[1] or (
                    targets is not None and tuple(targets.shape) !=
                    (hidden.shape[1], hidden.shape[2], 4)):
            raise ValueError(
                'hidden (L, B, Q, d), boxes (L, B, Q, 4), B '
                'data samples (and targets (B, Q, 4)) expected, '
                f'got {tuple(hidden.shape)}, '
                f'{tuple(boxes.shape)}, {len(data_samples)}' +
                ('' if targets is None else f', {tuple(targets.shape)}'))
        if head not in TARGET_HEADS:
            raise ValueError(f'a cache with targets is one of '
                             f'{TARGET_HEADS}, got {head!r}')
        head = 'decoder' if targets is None else head
        if self._head is not None and head != self._head:
            raise ValueError(f'a {self._head} cache takes no {head} batch '
                             '(targets for every batch or for none)')
        self._head = head
        shape = (hidden.shape[0], hidden.shape[2], hidden.shape[3])
        if self._shape is not None and shape != self._shape:
            raise ValueError(f'hidden states of shape {tuple(hidden.shape)} '
                             f'do not match the cache (L, Q, d) = '
                             f'{self._shape}')
        self._shape = shape
        if self.layers == 'last':
            hidden, boxes = hidden[-1:], boxes[-1:]
        arrays = dict(
            hidden=hidden.detach().transpose(0, 1).to(
                'cpu', getattr(torch, self.dtype)).numpy(),
            boxes=boxes.detach().transpose(0, 1).to('cpu',
                                                    torch.float32).numpy())
        if targets is not None:
            arrays['targets'] = targets.detach().to('cpu',
                                                    torch.float32).numpy()
        if self.folder is None:
            for name, arr in arrays.items():
                self._chunks[name].append(arr.copy())
        else:
            self._guard_io(lambda: self._append(arrays))
        for ds in data_samples:
            bboxes, labels = gt_arrays(ds)
            self._gt_bboxes.append(bboxes)
            self._gt_labels.append(labels)
            self._metainfo.append(metainfo_record(ds))
            self._batch_ids.append(int(batch_id))

    def _append(self, arrays: Dict[str, np.ndarray]) -> None:
        for name, arr in arrays.items():
            if name not in self._files:
                self._files[name] = NpyAppender(
                    osp.join(self.folder, f'{name}.npy'), arr.dtype,
                    arr.shape[1:])
            self._files[name].append(arr)

    def _small_arrays(self) -> Dict[str, np.ndarray]:
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(lab) for lab in self._gt_labels])
        return dict(
            gt_bboxes=np.concatenate(self._gt_bboxes).reshape(-1, 4).astype(
                np.float32),
            gt_labels=np.concatenate(self._gt_labels).astype(np.int64),
            gt_offsets=offsets,
            batch_ids=np.asarray(self._batch_ids, dtype=np.int64))

    def _meta(self, shapes: Dict[str, tuple], dtypes: Dict[str, str]) -> Dict:
        num_layers, num_queries, dims = self._shape
        return dict(
            format=CACHE_FORMAT,
            fingerprint=self.fingerprint,
            num_entries=len(self),
            num_decoder_layers=int(num_layers),
            num_stored_layers=int(num_layers) if self.layers == 'all' else 1,
            layers=self.layers,
            num_queries=int(num_queries),
            embed_dims=int(dims),
            dtype=self.dtype,
            head=self._head,
            classes=self.classes,
            arrays={
                name: dict(shape=list(shapes[name]), dtype=dtypes[name])
                for name in shapes
            },
            **self.info)

    def commit(self) -> DecoderCache:
        """Finish the cache and return its reader (the folder renamed into
        place first, where there is one)."""
        if self._done:
            raise RuntimeError('the decoder cache writer was closed')
        if not len(self):
            self.abort()
            raise ValueError('no images were cached')
        small = self._small_arrays()
        if self.folder is None:
            self._done = self._committed = True
            arrays = {
                name: np.concatenate(chunks)
                for name, chunks in self._chunks.items() if chunks
            }
            self._chunks = {}
            arrays.update(small)
            meta = self._meta({
                k: v.shape
                for k, v in arrays.items()
            }, {
                k: str(v.dtype)
                for k, v in arrays.items()
            })
            return DecoderCache(metainfo=self._metainfo, meta=meta, **arrays)
        self._guard_io(lambda: self._write(small))
        self._done = self._committed = True
        if self.target is None:
            cache = DecoderCache.open(self.folder)
            weakref.finalize(cache, shutil.rmtree, self.folder, True)
            return cache
        try:
            return self._rename_into_place()
        except BaseException:
            # a failed build removes its partial folder
            if osp.isdir(self.folder) and \
                    PRIVATE_NAME.match(osp.basename(self.folder)):
                shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _write(self, small: Dict[str, np.ndarray]) -> None:
        for appender in self._files.values():
            appender.close()
        for name, arr in small.items():
            np.save(osp.join(self.folder, f'{name}.npy'), arr)
        shapes = {k: a.shape for k, a in self._files.items()}
        dtypes = {k: str(a.dtype) for k, a in self._files.items()}
        shapes.update({k: v.shape for k, v in small.items()})
        dtypes.update({k: str(v.dtype) for k, v in small.items()})
        text = json.dumps(self._metainfo).encode()
        with open(osp.join(self.folder, METAINFO_FILE), 'wb') as f:
            f.write(text)
        meta = self._meta(shapes, dtypes)
        meta['files'] = {
            METAINFO_FILE:
            dict(size=len(text), sha1=hashlib.sha1(text).hexdigest())
        }
        with open(osp.join(self.folder, META_FILE), 'w') as f:
            json.dump(meta, f, indent=1)

    def _rename_into_place(self) -> DecoderCache:
        target = self.target
        for _ in range(5):
            if osp.isdir(target):
                try:
                    existing = DecoderCache.open(target)
                except CacheError:
                    existing = None
                if existing is not None and self.fingerprint is not None \
                        and existing.fingerprint == self.fingerprint:
                    # another run made the same cache meanwhile
                    shutil.rmtree(self.folder, ignore_errors=True)
                    return existing
                old = private_folder(
                    osp.dirname(target), osp.basename(target), 'old')
                try:
                    os.rename(target, old)
                except FileNotFoundError:
                    continue
                shutil.rmtree(old, ignore_errors=True)
            try:
                os.rename(self.folder, target)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    continue  # another run renamed its cache there first
                raise
            return DecoderCache.open(target)
        raise OSError(f'could not rename {self.folder} to {target}')

    def abort(self) -> None:
        """Drop what was written (the partial folder is removed); nothing
        after :meth:`commit`."""
        if self._committed:
            return
        self._done = True
        for appender in self._files.values():
            try:
                appender.close()
            except OSError:
                pass
        self._files = {}
        if self.folder is not None and osp.isdir(self.folder) and \
                PRIVATE_NAME.match(osp.basename(self.folder)):
            shutil.rmtree(self.folder, ignore_errors=True)


def fill_targets_cache(run_batch: Callable[[dict], tuple],
                       data: Iterable[dict],
                       writer: DecoderCacheWriter,
                       head: str,
                       progress: bool = True,
                       total: Optional[int] = None,
                       desc: str = 'cache') -> DecoderCache:
    """Write what ``run_batch`` keeps of each batch (no gradients) into a
    cache with targets and commit it (a failure removes what was written):
    the loop of a dense head's and a box head's cache.

    Args:
        run_batch (callable): ``run_batch(batch)`` gives the data samples,
            the features (1, B, Q, d), the boxes (1, B, Q, 4) and the
            targets (B, Q, 4) of a batch.
        data (Iterable[dict]): batches as a data loader yields them.
        writer (DecoderCacheWriter): where they go.
        head (str): the cache's kind, ``'dense'`` or ``'roi'``.
        progress (bool): show a progress bar.
        total (int, optional): images, for the progress bar.
        desc (str): the progress bar's label.

    Returns:
        DecoderCache: the cache.
    """
    with writer, torch.no_grad(), progress_bar(
            desc=desc, enabled=progress, total=total, unit='img',
            leave=True) as bar:
        for batch_id, batch in enumerate(data):
            samples, hidden, boxes, targets = run_batch(batch)
            writer.add(
                hidden, boxes, samples, batch_id, targets=targets, head=head)
            bar.update(len(samples))
        return writer.commit()
