# Copyright (c) mmcalidet contributors. All rights reserved.
"""The one decoder-cache format and its validation (the reader,
:class:`~.store.DecoderCache`, opens a folder through :func:`check_cache`).

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
failing later in a memory map. The kinds of cache, the errors and the
metainfo keys a cached batch carries are
:mod:`mmcalidet.utils.cache_kinds`'s.
"""
import hashlib
import json
import os.path as osp
from typing import Dict, Optional, Tuple

import numpy as np

from ..utils.cache_kinds import HEADS, TARGET_HEADS, CacheError, head_kind
from .npy import npy_problem

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
