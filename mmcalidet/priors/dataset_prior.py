# Copyright (c) mmcalidet contributors. All rights reserved.
"""E_t / E_v of a whole dataset, from any supported label source (a COCO
JSON, a YOLO folder or tarball: :func:`read_label_sets`)."""
import os.path as osp
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .label_io import (LabelSets, ProgressFn, read_class_names,
                       read_coco_labels, read_yolo_dir)
from .statistics import counts_from_flat, counts_to_prior
from .yolo_tarball import read_yolo_tarball


def read_label_sets(src: str,
                    classes: Optional[Sequence[str]] = None,
                    progress: ProgressFn = None) -> LabelSets:
    """Read label sets from a COCO JSON, a YOLO folder or a YOLO tarball.

    Args:
        src (str): the source.
        classes (Sequence[str], optional): class names (order) to use.
        progress (callable, optional): progress callback (see readers).

    Returns:
        LabelSets: the labels.
    """
    if osp.isdir(src):
        return read_yolo_dir(src, classes, progress)
    if src.endswith(('.tar.gz', '.tgz', '.tar')):
        return read_yolo_tarball(src, classes, progress)
    if src.endswith('.json'):
        return read_coco_labels(src, classes)
    if not osp.exists(src):
        raise ValueError(f'source not found: {src}')
    raise ValueError(f'unknown source type: {src} (expected a COCO .json, a '
                     'folder of YOLO .txt files or a .tar.gz of them)')


def is_yolo_source(src: str) -> bool:
    """Whether ``src`` is a YOLO folder or tarball (not a COCO JSON)."""
    return osp.isdir(src) or src.endswith(('.tar.gz', '.tgz', '.tar'))


def prior_from_source(
        src: str,
        classes: Optional[Union[str, Sequence[str]]] = None,
        progress: bool = True) -> Tuple[np.ndarray, np.ndarray, LabelSets]:
    """Compute the relation prior of a dataset.

    Args:
        src (str): COCO annotation JSON, folder of YOLO label files, or a
            ``.tar.gz`` of them (streamed).
        classes (str | Sequence[str], optional): a classes file or a list
            of names; required for YOLO labels (they carry no names).
        progress (bool): show a progress bar (tqdm) while reading.

    Returns:
        tuple: ``(prior, images_per_class, label_sets)``.

    Raises:
        ValueError: what the readers refuse, or a source of no images.
    """
    if isinstance(classes, str):
        classes = read_class_names(classes)
    if is_yolo_source(src) and classes is None:
        raise ValueError('YOLO labels carry no class names: pass classes '
                         '(--classes)')
    bar = None
    if progress and is_yolo_source(src):
        from tqdm import tqdm
        if osp.isdir(src):
            bar = tqdm(desc=osp.basename(osp.normpath(src)), unit=' files')
        else:
            bar = tqdm(total=osp.getsize(src), unit='B', unit_scale=True,
                       desc=osp.basename(src))
    try:
        sets = read_label_sets(src, classes,
                               progress=None if bar is None else bar.update)
    finally:
        if bar is not None:
            bar.close()
    if not sets.num_images:
        raise ValueError(f'{src} holds no images: a prior is computed from '
                         'the labels of images')
    cooc, counts = counts_from_flat(sets.labels, sets.offsets,
                                    len(sets.classes))
    return counts_to_prior(cooc, counts), counts, sets
