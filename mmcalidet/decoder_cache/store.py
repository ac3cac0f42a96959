# Copyright (c) mmcalidet contributors. All rights reserved.
"""The one decoder-cache format, its validation, and its reader.

A cache is a folder (or the same arrays in memory)::

    meta.json        format, fingerprint (what made it), the shape and type
                     of every array, size and SHA-1 of metainfo.json,
                     classes
    hidden.npy       (N, L', Q, d) hidden states: every decoder layer
                     (L' = L, ``layers='all'``) or the last (L' = 1)
    boxes.npy        (N, L', Q, 4) float32 boxes of those layers
                     (normalised cx, cy, w, h)
    gt_bboxes.npy    (M, 4) ground-truth boxes (x1, y1, x2, y2, pixels of
                     the transformed image), all images concatenated
    gt_labels.npy    (M,) their classes
    gt_offsets.npy   (N + 1,) image n owns rows offsets[n]:offsets[n+1]
    batch_ids.npy    (N,) the data-loader batch each image came in (the
                     E_b batches of the evaluation)
    metainfo.json    per image: img_id, img_path, img_shape, scale_factor,
                     ... (what the losses, heads and evaluators read)
    targets.npy      (N, Q, 4) float32, a dense head's or a box head's
                     cache only: per cached location (RoI) its level,
                     assigned label (K: background), soft quality target
                     and loss weight

A DETR cache (``meta['head'] == 'decoder'``) holds decoder queries. A
one-stage dense head's cache (``'dense'``, :mod:`.dense`) holds, as its
Q "queries" of one layer, the classification features (the input of each
level's classification conv) at the assigner's positive locations and a
sample of negative ones, their predicted boxes (normalised cx, cy, w, h)
and ``targets.npy``; padding rows have weight 0. A two-stage detector's
box-head cache (``'roi'``, :mod:`.roi`) holds the classification features
(the input of its classifier) of the RoIs its training sampler drew, their
boxes and ``targets.npy`` (level 0, label, 1 for a positive, the label
weight).

Opening checks every file against ``meta.json`` (header shape and type,
file size, JSON digest), so a torn or missing file is named instead of
failing later in a memory map. The large arrays are memory-mapped.
"""
import hashlib
import json
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.structures import DetDataSample
from torch import Tensor

from ..utils.cache_kinds import (  # noqa: F401  (the format's names)
    FOLDER_METAINFO, HEAD_METAINFO, HEAD_WORDS, HEADS, TARGET_HEADS,
    CacheError, CacheKindError, head_kind, kind_text)
from .npy import npy_problem
from .samples import rebuild_data_sample

#: bumped when the folder layout changes (the caches of formats this
#: version cannot read are made again)
CACHE_FORMAT = 3
#: the formats read: 2 is a format-3 decoder cache without a ``head`` key
READ_FORMATS = (2, 3)
META_FILE = 'meta.json'
METAINFO_FILE = 'metainfo.json'
#: the arrays of a cache, each in ``<name>.npy``
ARRAYS = ('hidden', 'boxes', 'gt_bboxes', 'gt_labels', 'gt_offsets',
          'batch_ids')
#: the extra array of a dense head's or a box head's cache
DENSE_ARRAYS = ('targets', )
#: the arrays memory-mapped on open (the others are small and loaded)
MAPPED = ('hidden', 'boxes')
#: the columns of ``targets.npy``
TARGET_COLUMNS = ('level', 'label', 'score', 'weight')


def _sha1(path: str) -> str:
    with open(path, 'rb') as f:
        return hashlib.sha1(f.read()).hexdigest()


def read_meta(folder: str) -> Dict:
    """The parsed ``meta.json`` of a cache folder.

    Raises:
        CacheError: missing, not JSON, or another format.
    """
    path = osp.join(folder, META_FILE)
    if not osp.isfile(path):
        raise CacheError(path, 'missing')
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise CacheError(path, f'unreadable ({exc})') from None
    if not isinstance(meta, dict) or not isinstance(meta.get('arrays'), dict):
        raise CacheError(path, 'not a decoder cache meta file')
    if meta.get('format') not in READ_FORMATS:
        raise CacheError(
            path, f'cache format {meta.get("format")}, this '
            f'version reads {list(READ_FORMATS)}')
    if meta.get('head', 'decoder') not in HEADS:
        raise CacheError(path, f'head {meta.get("head")!r} is none of '
                         f'{HEADS}')
    return meta


def cache_arrays(meta: Dict) -> Tuple[str, ...]:
    """The arrays a cache of this meta file holds.

    Args:
        meta (dict): the content of ``meta.json``.

    Returns:
        tuple[str]: the array names (a dense or box head's adds
        ``targets``).
    """
    if meta.get('head', 'decoder') in TARGET_HEADS:
        return ARRAYS + DENSE_ARRAYS
    return ARRAYS


def _expected_shapes(meta: Dict) -> Dict[str, Tuple[int, ...]]:
    """The array shapes implied by the meta file's counts."""
    arrays = meta['arrays']
    n, layers = meta['num_entries'], meta['num_stored_layers']
    q, d = meta['num_queries'], meta['embed_dims']
    m = arrays['gt_labels']['shape'][0]
    return dict(
        hidden=(n, layers, q, d),
        boxes=(n, layers, q, 4),
        gt_bboxes=(m, 4),
        gt_labels=(m, ),
        gt_offsets=(n + 1, ),
        batch_ids=(n, ),
        targets=(n, q, len(TARGET_COLUMNS)))


def targets_problem(targets: np.ndarray, num_levels: int,
                    num_classes: int) -> Optional[str]:
    """What is wrong with a dense cache's ``targets`` array, if anything.

    Args:
        targets (np.ndarray): (N, Q, 4) level, label, score, weight.
        num_levels (int): the head's levels.
        num_classes (int): K (label K is the background).

    Returns:
        str | None: the first problem found.
    """
    targets = np.asarray(targets)
    if not np.isfinite(targets).all():
        return 'holds values that are not finite'
    level, label, score, weight = np.moveaxis(targets, -1, 0)
    for name, values, top in (('level', level, num_levels - 1),
                              ('label', label, num_classes)):
        if (values != np.round(values)).any() or (values < 0).any() or \
                (values > top).any():
            return f'a {name} is not an integer in [0, {top}]'
    if (score < 0).any() or (score > 1).any():
        return 'a quality score is outside [0, 1]'
    if (weight < 0).any():
        return 'a loss weight is negative'
    return None


def check_cache(folder: str) -> Dict:
    """Validate a cache folder against its ``meta.json``: every array's
    header (shape, type) and size, the metainfo file's digest and length,
    the ground-truth offsets.

    Args:
        folder (str): the cache folder.

    Returns:
        dict: the meta file's content.

    Raises:
        CacheError: naming the first bad file.
    """
    meta = read_meta(folder)
    meta_path = osp.join(folder, META_FILE)
    names = cache_arrays(meta)
    try:
        expected = _expected_shapes(meta)
        recorded = {
            name: tuple(meta['arrays'][name]['shape'])
            for name in names
        }
    except (KeyError, TypeError, IndexError) as exc:
        raise CacheError(meta_path, f'incomplete ({exc!r})') from None
    for name in names:
        if recorded[name] != expected[name]:
            raise CacheError(
                meta_path, f'{name} recorded as {recorded[name]}, '
                f'{expected[name]} by the counts')
        path = osp.join(folder, f'{name}.npy')
        problem = npy_problem(path, recorded[name],
                              meta['arrays'][name]['dtype'])
        if problem:
            raise CacheError(path, problem)
    path = osp.join(folder, METAINFO_FILE)
    if not osp.isfile(path):
        raise CacheError(path, 'missing')
    info = meta.get('files', {}).get(METAINFO_FILE, {})
    if osp.getsize(path) != info.get('size') or _sha1(path) != info.get(
            'sha1'):
        raise CacheError(
            path, 'differs from the size and SHA-1 that '
            f'{META_FILE} records')
    offsets = np.load(osp.join(folder, 'gt_offsets.npy'))
    if offsets[0] != 0 or offsets[-1] != recorded['gt_labels'][0] or \
            (np.diff(offsets) < 0).any():
        raise CacheError(
            osp.join(folder, 'gt_offsets.npy'),
            'not increasing from 0 to the number of ground-truth boxes')
    if 'targets' in names:
        _check_targets(folder, meta)
    elif 'targets' in meta['arrays'] or 'num_levels' in meta:
        raise CacheError(
            meta_path, f'says "head": "{head_kind(meta)}" but records '
            'targets or levels (a dense or roi cache\'s): its head does '
            'not match its content')
    return meta


def _check_targets(folder: str, meta: Dict) -> None:
    """Refuse a dense or box head's ``targets.npy`` with impossible
    values."""
    path = osp.join(folder, 'targets.npy')
    try:
        num_levels = int(meta['num_levels'])
        num_classes = int(meta['num_classes'])
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheError(
            osp.join(folder, META_FILE),
            f'a {meta["head"]} cache without num_levels / num_classes '
            f'({exc!r})') from None
    targets = np.load(path)
    problem = targets_problem(targets, num_levels, num_classes)
    if problem:
        raise CacheError(path, problem)
    problem = head_problem(meta, targets)
    if problem:
        raise CacheError(osp.join(folder, META_FILE), problem)


def head_problem(meta: Dict, targets: np.ndarray) -> Optional[str]:
    """Whether a dense or roi cache's content is of the kind its
    ``meta['head']`` says: a two-stage box head's RoIs are of one level,
    the positives' scores 1 (a dense head's are IoU qualities, its
    locations of every level); a dense or roi cache stores one layer.

    Args:
        meta (dict): the content of ``meta.json``.
        targets (np.ndarray): (N, Q, 4) its level, label, score, weight.

    Returns:
        str | None: what contradicts the recorded head.
    """
    head = head_kind(meta)
    contradiction = f'says "head": "{head}" but '
    if int(meta.get('num_decoder_layers', 1)) != 1 or \
            int(meta.get('num_stored_layers', 1)) != 1:
        return (contradiction + f'stores {meta.get("num_stored_layers")} '
                'layers (a decoder cache\'s): its head does not match its '
                'content')
    if head != 'roi':
        return None
    level, _, score = np.moveaxis(np.asarray(targets), -1, 0)[:3]
    if int(meta['num_levels']) != 1 or (level != 0).any():
        return (contradiction + f'holds {int(meta["num_levels"])} levels '
                '(a dense head\'s locations, not a box head\'s RoIs): its '
                'head does not match its content')
    if ((score != 0) & (score != 1)).any():
        return (contradiction + 'holds soft quality scores (a dense '
                'head\'s locations, not a box head\'s RoIs): its head '
                'does not match its content')
    return None


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
