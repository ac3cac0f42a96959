# Copyright (c) mmcalidet contributors. All rights reserved.
"""Read image-level label sets from COCO JSON and YOLO folders (YOLO
tarballs: :mod:`.yolo_tarball`; any of the three:
:func:`~mmcalidet.priors.dataset_prior.read_label_sets`).

Every reader returns a :class:`LabelSets`: the class indices of all images
as one flat int64 array plus offsets, ready for the Cython counting core.
"""
import math
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np

from ..utils.file_io import (MAX_LABEL_FILE_BYTES, check_readable_file,
                             load_json, read_small_file)
from ._cooccurrence import parse_yolo
from .checks import check_class_names, class_name_list

ProgressFn = Optional[Callable[[int], None]]

#: COCO annotation files of the full dataset are ~450 MB
MAX_ANNOTATION_BYTES = 4 * 1024**3


@dataclass
class LabelSets:
    """Image-level labels of a set of images.

    Attributes:
        labels (np.ndarray): class indices of all images, concatenated.
        offsets (np.ndarray): N + 1 offsets; image k holds
            ``labels[offsets[k]:offsets[k + 1]]``.
        classes (list[str] | None): class names by index, when known.
        source (str): where the labels came from.
    """
    labels: np.ndarray
    offsets: np.ndarray
    classes: Optional[List[str]] = None
    source: str = ''
    extra: dict = field(default_factory=dict)

    @property
    def num_images(self) -> int:
        return int(self.offsets.size - 1)

    def label_lists(self) -> List[np.ndarray]:
        """Per-image arrays of class indices."""
        return np.split(self.labels, self.offsets[1:-1])


def read_class_names(path: str) -> List[str]:
    """Read class names from a classes file.

    Accepted: a JSON list of names, a JSON list of objects with ``name``
    (and optionally ``index``, as ``coco2017-labels/classes.json``), a JSON
    object with ``classes``, or a text file with one name per line.

    Args:
        path (str): the classes file.

    Returns:
        list[str]: names ordered by class index.
    """
    if path.endswith('.json'):
        data = load_json(path, 'classes file')
        if isinstance(data, dict):
            data = data.get('classes')
        if isinstance(data, list) and data and isinstance(data[0], dict):
            if any('name' not in d for d in data):
                raise ValueError(f'classes file {path}: every entry needs '
                                 'a "name"')
            if all('index' in d for d in data):
                data = sorted(data, key=lambda d: d['index'])
                if [d['index'] for d in data] != list(range(len(data))):
                    raise ValueError(f'classes file {path}: indices must '
                                     'be 0..K-1')
            data = [d['name'] for d in data]
        return check_class_names(data, f'classes file {path}')
    check_readable_file(path, what='classes file')
    with open(path, encoding='utf-8') as f:
        names = [line.strip() for line in f if line.strip()]
    return check_class_names(names, f'classes file {path}')


def _coco_entries(data: dict, key: str, path: str,
                  required: bool = True) -> list:
    """``data[key]``: a list of JSON objects."""
    entries = data.get(key)
    if entries is None and not required:
        return []
    if not isinstance(entries, list):
        what = 'missing' if key not in data else \
            f'a {type(entries).__name__}, not a list'
        raise ValueError(f'{path}: "{key}" is {what}')
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f'{path}: {key}[{k}] is a '
                             f'{type(entry).__name__}, not an object')
    return entries


def _coco_int(entry: dict, field_name: str, path: str, where: str) -> int:
    """An integer field of a COCO entry (``true``/``1.0``/``"3"`` refused,
    as they would silently be other ids)."""
    if field_name not in entry:
        raise ValueError(f'{path}: {where} has no "{field_name}"')
    value = entry[field_name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'{path}: {where} "{field_name}" must be an '
                         f'integer, got {value!r}')
    return value


def _check_coco_bbox(ann: dict, path: str, where: str) -> None:
    """A COCO ``bbox`` (where the annotation has one): four finite numbers
    ``[x, y, w, h]``, none negative (a NaN or negative box would be
    evaluated as some other box)."""
    box = ann['bbox']
    if not isinstance(box, list) or len(box) != 4 or any(
            isinstance(v, bool) or not isinstance(v, (int, float))
            for v in box):
        raise ValueError(f'{path}: {where} "bbox" must be 4 numbers [x, y, '
                         f'w, h], got {box!r}')
    if not all(math.isfinite(v) for v in box):
        raise ValueError(f'{path}: {where} has a non-finite "bbox" {box}')
    if min(box) < 0:
        raise ValueError(f'{path}: {where} has a negative "bbox" {box} '
                         '([x, y, w, h] are >= 0)')


def _coco_category_order(data: dict, classes: Optional[Sequence[str]],
                         path: str) -> tuple:
    """Map COCO category id -> contiguous class index."""
    if 'categories' not in data or not data['categories']:
        raise ValueError(f'{path}: no "categories" in the annotation file')
    categories = _coco_entries(data, 'categories', path)
    first = {}
    for k, cat in enumerate(categories):
        cat_id = _coco_int(cat, 'id', path, f'categories[{k}]')
        if cat_id in first:
            raise ValueError(f'{path}: duplicated category id {cat_id} '
                             f'(categories[{first[cat_id]}] and '
                             f'categories[{k}])')
        first[cat_id] = k
        if 'name' not in cat:
            raise ValueError(f'{path}: categories[{k}] has no "name"')
    cats = sorted(categories, key=lambda c: c['id'])
    names = [c['name'] for c in cats]
    check_class_names(names, f'{path}: category names')
    if classes is None:
        return {c['id']: k for k, c in enumerate(cats)}, names
    classes = class_name_list(classes)
    by_name = {c['name']: c['id'] for c in cats}
    unknown = [n for n in classes if n not in by_name]
    if unknown:
        raise ValueError(f'{path}: class {unknown[0]!r} is not a category '
                         'of the annotation file')
    return {by_name[n]: k for k, n in enumerate(classes)}, classes


def read_coco_labels(path: str,
                     classes: Optional[Sequence[str]] = None,
                     keep_names: bool = False) -> LabelSets:
    """Image-level labels from a COCO annotation JSON (crowd ignored).

    Images without (non-crowd) annotations count as images with no object.

    Args:
        path (str): the annotation file.
        classes (Sequence[str], optional): class order by name; default:
            the categories sorted by id (mmdet's contiguous order).
        keep_names (bool): keep each image's ``file_name`` (its id, as a
            string, where it has none) in ``extra['files']``.

    Returns:
        LabelSets: one entry per image of ``images``.

    Raises:
        ValueError: naming the file and the entry: not a COCO file,
            missing keys or values of the wrong type (ids must be integers,
            ``iscrowd`` 0 or 1), duplicated image or category ids, unknown
            ids in annotations, a ``bbox`` that is not four finite numbers
            >= 0.
    """
    data = load_json(path, 'annotation file', MAX_ANNOTATION_BYTES)
    return coco_label_sets(data, path, classes, keep_names)


def coco_label_sets(data: dict,
                    path: str,
                    classes: Optional[Sequence[str]] = None,
                    keep_names: bool = False) -> LabelSets:
    """:func:`read_coco_labels` of a file's loaded content: every check of
    the file (ids, categories, boxes) and the labels. Tools that read a
    COCO file for other uses (a site's evaluation) check it here too.

    Args:
        data (dict): the loaded JSON.
        path (str): the file, to name in errors.
        classes (Sequence[str], optional): as :func:`read_coco_labels`'s.
        keep_names (bool): as :func:`read_coco_labels`'s.

    Returns:
        LabelSets: one entry per image of ``images``.

    Raises:
        ValueError: as :func:`read_coco_labels`.
    """
    if not isinstance(data, dict) or 'images' not in data:
        raise ValueError(f'{path}: not a COCO annotation file (no "images")')
    cat_to_index, names = _coco_category_order(data, classes, path)
    images = _coco_entries(data, 'images', path)
    row = {}
    for k, img in enumerate(images):
        img_id = _coco_int(img, 'id', path, f'images[{k}]')
        if img_id in row:
            raise ValueError(f'{path}: duplicated image id {img_id} '
                             f'(images[{row[img_id]}] and images[{k}])')
        row[img_id] = k
    anns = _coco_entries(data, 'annotations', path, required=False)
    img_col = np.empty(len(anns), dtype=np.int64)
    cls_col = np.empty(len(anns), dtype=np.int64)
    n = outside = 0
    for k, ann in enumerate(anns):
        where = f'annotations[{k}] (id {ann.get("id")})'
        if 'bbox' in ann:
            _check_coco_bbox(ann, path, where)
        crowd = ann.get('iscrowd', 0)
        if crowd not in (0, 1):  # "no" would count as a crowd
            raise ValueError(f'{path}: {where} "iscrowd" must be 0 or 1, '
                             f'got {crowd!r}')
        if crowd:
            continue
        image_id = _coco_int(ann, 'image_id', path, where)
        cat = _coco_int(ann, 'category_id', path, where)
        if image_id not in row:
            raise ValueError(f'{path}: annotation {ann.get("id")} refers to '
                             f'unknown image id {image_id}')
        if cat not in cat_to_index:
            if classes is not None:
                outside += 1  # a category outside the requested classes
                continue
            raise ValueError(f'{path}: annotation {ann.get("id")} has '
                             f'unknown category id {cat}')
        img_col[n] = row[image_id]
        cls_col[n] = cat_to_index[cat]
        n += 1
    order = np.argsort(img_col[:n], kind='stable')
    labels = cls_col[:n][order]
    counts = np.bincount(img_col[:n], minlength=len(images))
    offsets = np.zeros(len(images) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    extra = dict(
        files=[str(img.get('file_name', img['id']))
               for img in images]) if keep_names else {}
    # counted, not dropped silently: the callers report it
    extra['outside_classes'] = outside
    return LabelSets(labels, offsets, list(names), source=path, extra=extra)


def check_yolo_result(result, names: Callable[[int], str]) -> tuple:
    labels, offsets, bad_file, bad_line, bad_fields = result
    if bad_file >= 0:
        what = ('a class index that is not a non-negative integer'
                if bad_fields < 0 else
                f'{bad_fields} fields (expected 5: class cx cy w h)')
        raise ValueError(
            f'{names(bad_file)}, line {bad_line}: {what}')
    return labels, offsets


def check_label_range(labels: np.ndarray, num_classes: Optional[int],
                      source: str) -> None:
    if num_classes is not None and labels.size and \
            labels.max() >= num_classes:
        raise ValueError(f'{source}: class index {labels.max()} is out of '
                         f'range for {num_classes} classes')


def read_yolo_dir(path: str,
                  classes: Optional[Sequence[str]] = None,
                  progress: ProgressFn = None) -> LabelSets:
    """Image-level labels from a folder of YOLO label files (``*.txt``,
    searched recursively; ``classes.txt`` is not a label file).

    Args:
        path (str): the folder.
        classes (Sequence[str], optional): class names by index.
        progress (callable, optional): called with the number of files
            read since the last call.

    Returns:
        LabelSets: one entry per label file, sorted by path.

    Raises:
        ValueError: naming the file: not a regular file (a FIFO, a device
            such as ``/dev/zero``), larger than ``MAX_LABEL_FILE_BYTES``, or
            a bad line.
    """
    files = []
    for root, _, names in os.walk(path):
        files.extend(
            osp.join(root, n) for n in names
            if n.endswith('.txt') and n != 'classes.txt')
    if not files:
        raise ValueError(f'no YOLO label files (*.txt) under {path}')
    files.sort()
    chunks, starts, sizes, pos = [], [], [], 0
    for k, fname in enumerate(files):
        # a FIFO or a link to /dev/zero would block or fill the memory
        data = read_small_file(
            fname, MAX_LABEL_FILE_BYTES, 'label file', allow_empty=True)
        chunks.append(data)
        starts.append(pos)
        sizes.append(len(data))
        pos += len(data)
        if progress is not None and (k + 1) % 1000 == 0:
            progress(1000)
    if progress is not None:
        progress(len(files) % 1000)
    buf = np.frombuffer(b''.join(chunks) or b'\0', dtype=np.uint8)
    labels, offsets = check_yolo_result(
        parse_yolo(buf, np.asarray(starts, dtype=np.int64),
                   np.asarray(sizes, dtype=np.int64)), lambda k: files[k])
    names = list(classes) if classes is not None else None
    check_label_range(labels, len(names) if names else None, path)
    return LabelSets(labels, offsets, names, source=path,
                     extra=dict(files=files))
