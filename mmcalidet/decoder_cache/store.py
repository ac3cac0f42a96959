# Copyright (c) mmcalidet contributors. All rights reserved.
"""The reader of a decoder cache, :class:`DecoderCache`: a folder
validated and memory-mapped (:meth:`DecoderCache.open`; the format and its
checks: :mod:`.folder_format`) or the same arrays in memory."""
import json
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.structures import DetDataSample
from torch import Tensor

from ..utils.cache_kinds import TARGET_HEADS, CacheError
from .folder_format import MAPPED, METAINFO_FILE, cache_arrays, check_cache
from .samples import rebuild_data_sample


class DecoderCache:
    """Cached decoder outputs with the images' data samples: the reader
    of both the calibrator's training set and the evaluation protocol,
    over a cache folder (:meth:`open`) or arrays in memory.

    Args:
        hidden (np.ndarray): (N, L', Q, d) hidden states.
        boxes (np.ndarray): (N, L', Q, 4) boxes (normalised cxcywh).
        gt_bboxes (np.ndarray): (M, 4) ground-truth boxes.
        gt_labels (np.ndarray): (M,) their classes.
        gt_offsets (np.ndarray): (N + 1,) each image's rows of them.
        batch_ids (np.ndarray): (N,) each image's data-loader batch.
        metainfo (list[dict]): each image's metainfo record.
        meta (dict): what ``meta.json`` holds (fingerprint, counts,
            ``num_decoder_layers``, ``layers``, ``classes``).
        folder (str, optional): the folder the arrays are mapped from.
        targets (np.ndarray, optional): (N, Q, 4) a dense head's location
            targets (``targets.npy``).
    """

    def __init__(self,
                 hidden: np.ndarray,
                 boxes: np.ndarray,
                 gt_bboxes: np.ndarray,
                 gt_labels: np.ndarray,
                 gt_offsets: np.ndarray,
                 batch_ids: np.ndarray,
                 metainfo: List[Dict],
                 meta: Dict,
                 folder: Optional[str] = None,
                 targets: Optional[np.ndarray] = None) -> None:
        n = len(hidden)
        if not (len(boxes) == n == len(metainfo) == len(batch_ids) ==
                len(gt_offsets) - 1) or (targets is not None
                                         and len(targets) != n):
            raise ValueError('the cache arrays disagree on the number of '
                             'images')
        if (targets is None) != (meta.get('head') not in TARGET_HEADS):
            raise ValueError('a dense or box head\'s cache has targets, a '
                             'decoder cache has none')
        #: (N, Q, 4) a dense head's location (a box head's RoI) targets,
        #: else None
        self.targets = targets
        self.hidden = hidden
        self.boxes = boxes
        self.gt_bboxes = gt_bboxes
        self.gt_labels = gt_labels
        self.gt_offsets = gt_offsets
        self.metainfo = metainfo
        self.meta = meta
        self.folder = folder
        #: the data-loader batch of each image (the E_b batches)
        self.batch_ids: List[int] = [int(b) for b in batch_ids]
        #: whether an existing folder was reused rather than made
        self.reused = False
        self._samples: Optional[List[DetDataSample]] = None
        #: images whose stored values were found finite (each is checked
        #: on its first read, so the check costs one pass over the cache)
        self._finite = np.zeros(n, dtype=bool)
        self._finite_last = np.zeros(n, dtype=bool)

    @classmethod
    def open(cls, folder: str) -> 'DecoderCache':
        """Validate (:func:`check_cache`) and memory-map a cache folder.

        Raises:
            CacheError: naming a missing, torn or garbled file.
        """
        meta = check_cache(folder)
        arrays = {
            name:
            np.load(
                osp.join(folder, f'{name}.npy'),
                mmap_mode='r' if name in MAPPED else None)
            for name in cache_arrays(meta)
        }
        path = osp.join(folder, METAINFO_FILE)
        try:
            with open(path) as f:
                metainfo = json.load(f)
        except ValueError as exc:
            raise CacheError(path, f'unreadable ({exc})') from None
        if not isinstance(metainfo, list) or \
                len(metainfo) != meta['num_entries']:
            raise CacheError(path, 'not one record per image')
        return cls(metainfo=metainfo, meta=meta, folder=folder, **arrays)

    def _check_finite(self,
                      idx: np.ndarray,
                      hidden: np.ndarray,
                      boxes: np.ndarray,
                      all_layers: bool = False) -> None:
        """Refuse non-finite hidden states or boxes of the images ``idx``
        (read as ``hidden``, ``boxes``) on their first read: every layer
        (``all_layers``) or the last."""
        seen = self._finite if all_layers else self._finite_last
        new = ~seen[idx]
        if not new.any():
            return
        for name, values in (('hidden', hidden), ('boxes', boxes)):
            part = values if new.all() else values[new]
            if not np.isfinite(part).all():
                rows = idx if new.all() else idx[new]
                bad = [
                    int(rows[i]) for i in range(len(part))
                    if not np.isfinite(part[i]).all()
                ]
                path = f'<in memory>/{name}' if self.folder is None else \
                    osp.join(self.folder, f'{name}.npy')
                raise CacheError(
                    path, f'the {name} values of image {bad[0]} are not '
                    f'finite ({len(bad)} such image(s) in this read): the '
                    'cache is damaged; make it again')
        seen[idx] = True
        if all_layers:
            self._finite_last[idx] = True

    def check_values(self, chunk: int = 64) -> 'DecoderCache':
        """Read every image once and check its hidden states and boxes
        are finite (what :meth:`get` and :meth:`layers_of` check on a
        first read).

        Args:
            chunk (int): images per read.

        Returns:
            DecoderCache: itself.

        Raises:
            CacheError: naming the file and the first bad image.
        """
        for start in range(0, len(self), chunk):
            idx = np.arange(start, min(start + chunk, len(self)))
            self._check_finite(
                idx,
                np.asarray(self.hidden[idx]),
                np.asarray(self.boxes[idx]),
                all_layers=True)
        return self

    def __len__(self) -> int:
        return len(self.hidden)

    @property
    def fingerprint(self) -> Optional[Dict]:
        """What made the cache (``None`` for an unkeyed one)."""
        return self.meta.get('fingerprint')

    @property
    def classes(self) -> Optional[Tuple[str, ...]]:
        """The detector's class names, where known."""
        classes = self.meta.get('classes')
        return tuple(classes) if classes else None

    @property
    def num_layers(self) -> int:
        """L', the stored decoder layers."""
        return int(self.hidden.shape[1])

    @property
    def layer_index(self) -> int:
        """Index among the detector's decoder layers of the last stored
        one (what the evaluation scores)."""
        return int(self.meta['num_decoder_layers']) - 1

    @property
    def num_queries(self) -> int:
        return int(self.hidden.shape[2])

    @property
    def embed_dims(self) -> int:
        return int(self.hidden.shape[3])

    @property
    def bytes_per_image(self) -> int:
        """Bytes of hidden states and boxes per image."""
        return int(self.hidden[:1].nbytes + self.boxes[:1].nbytes)

    @property
    def nbytes(self) -> int:
        """Bytes of the hidden states and boxes of all images."""
        return self.bytes_per_image * len(self)

    def gt_arrays(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        """Ground-truth boxes (M, 4) and classes (M,) of an image."""
        lo, hi = int(self.gt_offsets[index]), int(self.gt_offsets[index + 1])
        return self.gt_bboxes[lo:hi], self.gt_labels[lo:hi]

    def data_sample(self, index: int) -> DetDataSample:
        """A new data sample of an image: metainfo and ``gt_instances``."""
        return rebuild_data_sample(self.metainfo[index],
                                   *self.gt_arrays(index))

    @property
    def data_samples(self) -> List[DetDataSample]:
        """The data samples of all images (made once)."""
        if self._samples is None:
            self._samples = [self.data_sample(k) for k in range(len(self))]
        return self._samples

    def layers_of(self, index: int) -> Tuple[Tensor, Tensor]:
        """Every stored layer of an image: hidden states (L', Q, d) and
        boxes (L', Q, 4), float32 CPU tensors (training items).

        Raises:
            CacheError: the image's stored values are not finite.
        """
        hidden = np.array(self.hidden[index], dtype=np.float32)
        boxes = np.array(self.boxes[index], dtype=np.float32)
        self._check_finite(
            np.array([index], dtype=np.int64),
            hidden[None],
            boxes[None],
            all_layers=True)
        return torch.from_numpy(hidden), torch.from_numpy(boxes)

    def targets_of(self, index: int) -> Optional[Tensor]:
        """A dense (a RoI) cache's (Q, 4) location (RoI) targets of an
        image (level, label, score, weight; float32), or ``None`` for a
        decoder cache."""
        if self.targets is None:
            return None
        return torch.from_numpy(np.array(self.targets[index], np.float32))

    def get(
        self,
        indices: Sequence[int],
        device: Union[str, torch.device] = 'cpu'
    ) -> Tuple[Tensor, Tensor, List[DetDataSample]]:
        """The last stored layer of some images (what the evaluation
        re-scores).

        Args:
            indices (Sequence[int]): image indices.
            device (str | torch.device): where to put the tensors.

        Returns:
            tuple: hidden states (B, Q, d) and boxes (B, Q, 4), float32,
            and the data samples.

        Raises:
            CacheError: the stored values of an image are not finite (each
                image is checked on its first read).
        """
        idx = np.asarray(indices, dtype=np.int64)
        hidden = np.array(self.hidden[idx, -1], dtype=np.float32)
        boxes = np.array(self.boxes[idx, -1], dtype=np.float32)
        self._check_finite(idx, hidden, boxes)
        samples = self.data_samples
        return (torch.from_numpy(hidden).to(device),
                torch.from_numpy(boxes).to(device), [samples[k] for k in idx])

    def gt_label_lists(self) -> List[np.ndarray]:
        """Per-image ground-truth class indices (int64)."""
        return [
            np.array(self.gt_arrays(k)[1], dtype=np.int64)
            for k in range(len(self))
        ]

    def img_ids(self) -> List:
        """The ``img_id`` of every image (``None`` where unknown)."""
        return [m.get('img_id') for m in self.metainfo]
