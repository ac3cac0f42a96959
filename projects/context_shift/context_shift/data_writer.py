# Copyright (c) mmcalidet contributors. All rights reserved.
"""The writing part of the context-shift generator
(:func:`~.data.make_context_shift`): image files, COCO annotations, the
priors, the class list and ``meta.json``, under a temporary folder renamed
at the end (an interrupted run leaves no half-written benchmark; a failed
one removes the temporary folder, and the next run removes one that a
killed run left).

It draws nothing at random: :mod:`.data` samples and renders the scenes
and hands each image to :class:`BenchmarkWriter`.
"""
import errno
import json
import os
import os.path as osp
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def label_statistics(label_lists: Sequence[Sequence[int]],
                     num_classes: int) -> Dict:
    """Per-image class statistics of a split (how COCO-like it is).

    The column j of an image's E_x differs from the flat E0 exactly when
    class j is in the image, so the share of E_x's columns off E0 is the
    image's number of classes over K (COCO train2017: 2.9 / 80, 3.7 %).

    Args:
        label_lists (Sequence[Sequence[int]]): class indices per image.
        num_classes (int): K.

    Returns:
        dict: ``images``, ``objects_per_image`` (mean),
        ``classes_per_image`` (mean number of distinct classes),
        ``classes_per_image_range`` ([min, max]) and
        ``ex_columns_off_e0`` (mean share of E_x's columns that differ
        from E0).
    """
    objects = np.array([len(labels) for labels in label_lists], np.float64)
    distinct = np.array([len(set(labels)) for labels in label_lists],
                        np.float64)
    if not len(objects):
        raise ValueError('label_statistics needs at least one image')
    return dict(
        images=len(objects),
        objects_per_image=round(float(objects.mean()), 4),
        classes_per_image=round(float(distinct.mean()), 4),
        classes_per_image_range=[int(distinct.min()), int(distinct.max())],
        ex_columns_off_e0=round(float(distinct.mean()) / num_classes, 4))


def coco_dict(images: List[Dict], anns: List[Dict], classes: Sequence[str],
              supercategories: Optional[Sequence[str]] = None) -> Dict:
    """A COCO annotation file's content.

    Args:
        images (list[dict]): the image records.
        anns (list[dict]): the annotation records.
        classes (Sequence[str]): the class names (category ids from 1).
        supercategories (Sequence[str], optional): one per class; default
            ``digit`` for every class.

    Returns:
        dict: ``images``, ``annotations`` and ``categories``.
    """
    if supercategories is None:
        supercategories = ['digit'] * len(classes)
    return dict(
        images=images,
        annotations=anns,
        categories=[
            dict(id=k + 1, name=name, supercategory=sup)
            for k, (name, sup) in enumerate(zip(classes, supercategories))
        ])


def _merge_sites(splits: Dict[str, Dict]) -> Tuple[List[Dict], List[Dict]]:
    """The image and annotation records of every val site in one list each
    (ids renumbered, each image tagged with its ``site``).

    Args:
        splits (dict): split key -> ``images`` / ``anns`` / ``labels``.

    Returns:
        tuple[list, list]: the images and the annotations.
    """
    all_images: List[Dict] = []
    all_anns: List[Dict] = []
    for key, data in splits.items():
        if key == 'train':
            continue
        site = key[len('val_'):]
        offset_img, offset_ann = len(all_images), len(all_anns)
        for img in data['images']:
            all_images.append(dict(img, id=img['id'] + offset_img, site=site))
        for ann in data['anns']:
            all_anns.append(
                dict(ann, id=ann['id'] + offset_ann,
                     image_id=ann['image_id'] + offset_img))
    return all_images, all_anns


def remove_leftovers(out_dir: str) -> List[str]:
    """Remove the temporary folders of a data folder that a killed run
    left: ``<out_dir>.partial`` (being written) and ``<out_dir>.old`` (an
    old folder being replaced, once the new one is in place).

    Args:
        out_dir (str): the data folder.

    Returns:
        list[str]: the folders removed.
    """
    removed = []
    leftovers = [out_dir + '.partial']
    if osp.exists(out_dir):  # .old is the only copy while out_dir is absent
        leftovers.append(out_dir + '.old')
    for path in leftovers:
        if osp.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def disk_full_error(exc: OSError, out_dir: str) -> OSError:
    """A full disk as one error naming the data folder (others as they
    are).

    Args:
        exc (OSError): the error raised while writing.
        out_dir (str): the data folder being made.

    Returns:
        OSError: the error to raise.
    """
    if exc.errno != errno.ENOSPC:
        return exc
    return OSError(
        errno.ENOSPC, f'no space left on the device for {out_dir} (nothing '
        'was written: the partial folder was removed)')


class BenchmarkWriter:
    """Write a context-shift benchmark folder.

    Everything goes to ``<out_dir>.partial`` first; :meth:`commit` renames
    it to ``out_dir`` (replacing an old folder when ``overwrite``), and
    :meth:`abort` (a failed run) removes it. A ``.partial`` (or ``.old``)
    folder that a killed run left is removed when the next writer of
    ``out_dir`` starts, whether or not it goes on.

    Args:
        out_dir (str): the folder to create.
        classes (Sequence[str]): the class names.
        img_size (int): the images' side (their COCO width and height).
        overwrite (bool): replace an existing folder.

    Raises:
        ValueError: ``out_dir`` exists and ``overwrite`` is False.
    """

    def __init__(self, out_dir: str, classes: Sequence[str], img_size: int,
                 overwrite: bool = False) -> None:
        out_dir = osp.abspath(out_dir)
        self.out_dir = out_dir
        self.tmp = out_dir + '.partial'
        remove_leftovers(out_dir)
        if osp.exists(out_dir) and not overwrite:
            raise ValueError(f'{out_dir} exists (pass overwrite=True / '
                             '--overwrite to replace it)')
        self.classes = classes
        self.img_size = img_size
        #: split key (``train``, ``val_<site>``) -> ``images`` (COCO image
        #: records), ``anns`` (COCO annotations), ``labels`` (per image)
        self.splits: Dict[str, Dict] = {}

    def start_split(self, key: str, folder: str) -> None:
        """Open a split: its image folder and its (empty) records.

        Args:
            key (str): ``train`` or ``val_<site>``.
            folder (str): the image folder under ``images/``.
        """
        os.makedirs(osp.join(self.tmp, 'images', folder), exist_ok=True)
        self.splits[key] = dict(images=[], anns=[], labels=[])

    def add_image(self, key: str, folder: str, scene: str,
                  labels: List[int], pixels: np.ndarray,
                  boxes: Sequence[List[int]]) -> None:
        """Save one rendered image and record its annotations.

        Args:
            key (str): the split (opened by :meth:`start_split`).
            folder (str): the split's image folder.
            scene (str): the image's scene type.
            labels (list[int]): the class index of each object.
            pixels (np.ndarray): H x W x 3 uint8 image.
            boxes (Sequence[list[int]]): ``[x, y, w, h]`` per object.
        """
        from PIL import Image
        split = self.splits[key]
        images, anns = split['images'], split['anns']
        file_name = f'{folder}/{key}_{len(images):06d}.png'
        Image.fromarray(pixels).save(osp.join(self.tmp, 'images', file_name))
        img_id = len(images) + 1
        images.append(
            dict(id=img_id, file_name=file_name, width=self.img_size,
                 height=self.img_size, scene_type=scene))
        for c, box in zip(labels, boxes):
            anns.append(
                dict(id=len(anns) + 1, image_id=img_id, category_id=c + 1,
                     bbox=box, area=box[2] * box[3], iscrowd=0))
        split['labels'].append(labels)

    def write_train_prior(self, num_train: int) -> np.ndarray:
        """Write ``priors/E_t.json`` (with the images per class that the
        marginal re-weighting baseline needs beside E_t).

        Args:
            num_train (int): the number of train images.

        Returns:
            np.ndarray: E_t.
        """
        from mmcalidet.priors import batch_prior, save_prior
        num_classes = len(self.classes)
        os.makedirs(osp.join(self.tmp, 'annotations'))
        os.makedirs(osp.join(self.tmp, 'priors'))
        train_labels = self.splits['train']['labels']
        e_t = batch_prior(num_classes, train_labels)
        present = np.zeros(num_classes, np.int64)
        for labels in train_labels:
            present[np.unique(np.asarray(labels, np.int64))] += 1
        save_prior(
            osp.join(self.tmp, 'priors', 'E_t.json'), e_t, self.classes,
            source='context-shift train', num_images=num_train,
            images_per_class={
                c: int(n)
                for c, n in zip(self.classes, present)
            })
        return e_t

    def _write_coco(self, key: str, images: List[Dict], anns: List[Dict],
                    supercategories: Optional[Sequence[str]]) -> None:
        path = osp.join(self.tmp, 'annotations', f'instances_{key}.json')
        with open(path, 'w') as f:
            json.dump(coco_dict(images, anns, self.classes, supercategories),
                      f)

    def write_splits(self, meta: Dict, e_t: np.ndarray,
                     supercategories: Optional[Sequence[str]]) -> None:
        """Write every split's annotations and every val site's prior, the
        annotations and prior of all sites together (``instances_val.json``
        and ``E_v.json``); add their statistics and epsilons to ``meta``.

        Args:
            meta (dict): the metadata; its ``statistics`` and ``epsilon``
                get an entry per site and ``val`` / ``all_sites``.
            e_t (np.ndarray): the train prior the epsilons are taken to.
            supercategories (Sequence[str], optional): see
                :func:`coco_dict`.
        """
        from mmcalidet.priors import batch_prior, prior_mae, save_prior
        num_classes = len(self.classes)
        for key, data in self.splits.items():
            self._write_coco(key, data['images'], data['anns'],
                             supercategories)
            if key == 'train':
                continue
            site = key[len('val_'):]
            meta['statistics'][key] = label_statistics(
                data['labels'], num_classes)
            e_site = batch_prior(num_classes, data['labels'])
            save_prior(
                osp.join(self.tmp, 'priors', f'E_{site}.json'), e_site,
                self.classes, source=f'context-shift val site {site}',
                num_images=len(data['labels']))
            meta['epsilon'][site] = prior_mae(e_site, e_t)
        self._write_coco('val', *_merge_sites(self.splits), supercategories)
        val_labels = [
            lab for key, d in self.splits.items() if key != 'train'
            for lab in d['labels']
        ]
        e_v = batch_prior(num_classes, val_labels)
        save_prior(osp.join(self.tmp, 'priors', 'E_v.json'), e_v,
                   self.classes, source='context-shift val (all sites)')
        meta['epsilon']['all_sites'] = prior_mae(e_v, e_t)
        meta['statistics']['val'] = label_statistics(val_labels, num_classes)

    def abort(self) -> None:
        """Remove what was written (the temporary folder); the run failed.
        ``out_dir`` is left as it was."""
        if osp.lexists(self.tmp):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def commit(self, meta: Dict) -> None:
        """Write ``classes.txt`` and ``meta.json``, then move the folder
        into place (replacing an old one).

        Args:
            meta (dict): the metadata for ``meta.json``.
        """
        with open(osp.join(self.tmp, 'classes.txt'), 'w') as f:
            f.write('\n'.join(self.classes) + '\n')
        with open(osp.join(self.tmp, 'meta.json'), 'w') as f:
            json.dump(meta, f, indent=1)
        if osp.exists(self.out_dir):
            old = self.out_dir + '.old'
            if osp.exists(old):
                shutil.rmtree(old)
            os.replace(self.out_dir, old)
            try:
                os.replace(self.tmp, self.out_dir)
            except BaseException:
                os.replace(old, self.out_dir)  # the old folder stays
                raise
            shutil.rmtree(old)
        else:
            os.replace(self.tmp, self.out_dir)
