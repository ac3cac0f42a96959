# Copyright (c) mmcalidet contributors. All rights reserved.
"""The labels and groups of an evaluation set read from files: image-level
labels in the order the subset split uses (:func:`read_evaluation_labels`)
and the site of each evaluated image (:func:`read_image_groups`).
"""
import json
import os.path as osp
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..utils.file_io import check_readable_file


def _read_image_list(path: str) -> List[str]:
    """Image names from a JSON object / list (e.g.
    ``val2017_image_sizes.json``) or a text file, one per line."""
    from ..utils.file_io import load_json
    if path.endswith('.json'):
        data = load_json(path, 'image list')
        if isinstance(data, dict):
            return list(data)
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return data
        raise ValueError(f'image list {path}: expected a JSON object keyed '
                         'by image name or a list of names')
    check_readable_file(path, what='image list')
    with open(path, encoding='utf-8') as f:
        return [line.strip() for line in f if line.strip()]


def _stem(name: str) -> str:
    return osp.splitext(osp.basename(name))[0]


def read_evaluation_labels(
    src: str,
    classes=None,
    image_list: Optional[str] = None
) -> Tuple[List[np.ndarray], List[str], List[str]]:
    """Image-level labels of an evaluation set, in the order the subset
    split uses.

    Args:
        src (str): a COCO annotation JSON (every image listed, in file
            order) or YOLO labels (a folder or ``.tar.gz``; one file per
            labelled image, in the reader's sorted order).
        classes (str | Sequence[str], optional): class names (a classes
            file or list); required for YOLO labels.
        image_list (str, optional): all image names (e.g.
            ``val2017_image_sizes.json``); images without a label file are
            appended, sorted by name, as images with no object.

    Returns:
        tuple: ``(label_lists, image_names, classes)``.
    """
    from ..priors.dataset_prior import is_yolo_source
    from ..priors.label_io import (read_class_names, read_coco_labels,
                                   read_yolo_dir)
    from ..priors.yolo_tarball import read_yolo_tarball
    if isinstance(classes, str):
        classes = read_class_names(classes)
    if is_yolo_source(src):
        if classes is None:
            raise ValueError('YOLO labels carry no class names: pass '
                             'classes')
        sets = read_yolo_dir(src, classes) if osp.isdir(src) else \
            read_yolo_tarball(src, classes, keep_names=True)
        names = [_stem(f) for f in sets.extra['files']]
    else:
        sets = read_coco_labels(src, classes, keep_names=True)
        names = [_stem(f) for f in sets.extra['files']]
    label_lists = sets.label_lists()
    if image_list is not None:
        known = set(names)
        listed = [_stem(n) for n in _read_image_list(image_list)]
        unlisted = known - set(listed)
        if unlisted:
            raise ValueError(f'{len(unlisted)} labelled images are not in '
                             f'the image list, e.g. {sorted(unlisted)[0]}')
        empty = sorted(set(listed) - known)
        names = names + empty
        label_lists = label_lists + [np.zeros(0, np.int64)] * len(empty)
    return label_lists, names, list(sets.classes or classes)


def read_image_groups(ann_file: str,
                      img_ids: Sequence,
                      key: str = 'site') -> List[str]:
    """The group (site) of each evaluated image, from a COCO JSON whose
    ``images`` entries carry ``key`` (e.g. the context-shift benchmark's
    ``instances_val.json``).

    Args:
        ann_file (str): COCO annotation file.
        img_ids (Sequence): ids of the evaluated images, in cache order.
        key (str): the image field naming the group. Defaults to ``site``.

    Returns:
        list[str]: the group of each image of ``img_ids``.
    """
    check_readable_file(ann_file, what='annotation file')
    with open(ann_file) as f:
        data = json.load(f)
    images = data.get('images') if isinstance(data, dict) else None
    if not images:
        raise ValueError(f'{ann_file}: no images')
    by_id = {}
    for img in images:
        if key not in img:
            raise ValueError(f'{ann_file}: image {img.get("id")} has no '
                             f'{key!r} field')
        by_id[img['id']] = str(img[key])
    missing = [i for i in img_ids if i not in by_id]
    if missing:
        raise ValueError(f'{ann_file} has no image with id {missing[0]!r} '
                         '(is it the evaluated annotation file?)')
    return [by_id[i] for i in img_ids]
