# Copyright (c) mmcalidet contributors. All rights reserved.
"""A synthetic detection benchmark where context carries information and
deployment sites shift it.

Scenes (default 128 x 128) hold 2-6 handwritten digits drawn from
scikit-learn's bundled digits data (1,797 real 8 x 8 scans, 10 classes).
Train and val use disjoint scans (held-out appearances). Digits are small,
noisy and come in look-alike pairs (1/7, 3/8, 4/9, 5/6), so appearance
alone is not always enough.

Composition follows latent *scene types*: each has a table of class
weights; an image picks a scene type from mixture weights, then its
objects from that table. Look-alikes sit in different scene types, so the
other objects of an image tell which of a pair is likely -- the context a
detector learns, and a prior (E) describes. *Deployment sites* (val
subsets) use other mixtures or tables, so their E differs from the train
set's E_t.

Why digits rather than crops of coco-mini: 1,797 scans give ~180
appearances per class with a clean train/val split, and the look-alike
pairs are real (no synthetic ambiguity); coco-mini has too few boxes per
class (many classes under 10) to hold out appearances.
"""
import copy
import json
import os
import os.path as osp
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

CLASSES = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven',
           'eight', 'nine')

#: look-alike pairs at low resolution (documentation, and the default
#: tables put each pair's members in different scene types)
LOOKALIKES = ((1, 7), (3, 8), (4, 9), (5, 6))

#: the default scene model; every knob can be changed by a JSON file
DEFAULT_SCENES: Dict = {
    # class weights per scene type (index = digit)
    'scene_types': {
        'left': [2, 4, 1, 4, 4, 4, 0, 0, 0, 0],
        'right': [0, 0, 1, 0, 0, 0, 4, 4, 4, 4],
        'mixed': [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    },
    # train mixture over scene types
    'train_mixture': {'left': 0.45, 'right': 0.45, 'mixed': 0.10},
    # deployment sites: a mixture over scene types, optionally with
    # site-only scene types
    'sites': {
        'like_train': {'mixture': {'left': 0.45, 'right': 0.45,
                                   'mixed': 0.10}},
        'left_only': {'mixture': {'left': 1.0}},
        'crossed': {
            'mixture': {'crossed': 1.0},
            'scene_types': {'crossed': [0, 4, 0, 4, 0, 0, 4, 0, 0, 4]},
        },
    },
}


def load_digits_split(val_fraction: float = 0.4,
                      seed: int = 0) -> Tuple[List, List]:
    """Split scikit-learn's digits scans per class into train / val.

    Args:
        val_fraction (float): share of each class's scans held out.
        seed (int): shuffling seed.

    Returns:
        tuple[list, list]: for train and val, a list (by class) of
        ``(n, 8, 8)`` float arrays in [0, 1].
    """
    from sklearn.datasets import load_digits
    digits = load_digits()
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in range(len(CLASSES)):
        scans = digits.images[digits.target == c] / 16.0
        order = rng.permutation(len(scans))
        n_val = int(round(len(scans) * val_fraction))
        val.append(scans[order[:n_val]])
        train.append(scans[order[n_val:]])
    return train, val


def _normalise(weights: Sequence[float], what: str) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or np.any(w < 0) or not np.isfinite(w).all() or \
            w.sum() <= 0:
        raise ValueError(f'{what}: weights must be non-negative with a '
                         f'positive sum, got {list(weights)}')
    return w / w.sum()


def check_scene_model(scenes: Dict) -> Dict:
    """Validate a scene model (the structure of :data:`DEFAULT_SCENES`).

    Returns:
        dict: the model, unchanged.
    """
    types = scenes.get('scene_types')
    if not isinstance(types, dict) or not types:
        raise ValueError('scene model needs "scene_types"')
    for name, table in types.items():
        if len(table) != len(CLASSES):
            raise ValueError(f'scene type {name!r}: {len(table)} weights, '
                             f'expected {len(CLASSES)}')
        _normalise(table, f'scene type {name!r}')

    def check_mixture(mixture, known, what):
        if not isinstance(mixture, dict) or not mixture:
            raise ValueError(f'{what}: a mixture must be a non-empty dict')
        for name in mixture:
            if name not in known:
                raise ValueError(f'{what}: unknown scene type {name!r}')
        _normalise(list(mixture.values()), what)

    check_mixture(scenes.get('train_mixture'), types, 'train_mixture')
    sites = scenes.get('sites')
    if not isinstance(sites, dict) or not sites:
        raise ValueError('scene model needs "sites"')
    for site, spec in sites.items():
        known = dict(types, **spec.get('scene_types', {}))
        for name, table in spec.get('scene_types', {}).items():
            if len(table) != len(CLASSES):
                raise ValueError(f'site {site!r}, scene type {name!r}: '
                                 f'{len(table)} weights')
            _normalise(table, f'site {site!r}, scene type {name!r}')
        check_mixture(spec.get('mixture'), known, f'site {site!r}')
    return scenes


class SceneRenderer:
    """Draw and render scenes.

    Args:
        img_size (int): square image size in pixels.
        digit_size (tuple[int, int]): min / max digit box side.
        objects (tuple[int, int]): min / max objects per image.
        noise_std (float): std of the Gaussian pixel noise (0-1 scale).
        rng (np.random.Generator): the random source.
    """

    def __init__(self, img_size: int, digit_size: Tuple[int, int],
                 objects: Tuple[int, int], noise_std: float,
                 rng: np.random.Generator) -> None:
        if not 1 <= objects[0] <= objects[1]:
            raise ValueError(f'objects must satisfy 1 <= min <= max, got '
                             f'{objects}')
        if not 4 <= digit_size[0] <= digit_size[1] <= img_size // 2:
            raise ValueError(f'digit sizes {digit_size} do not fit '
                             f'{img_size} px images')
        self.img_size = img_size
        self.digit_size = digit_size
        self.objects = objects
        self.noise_std = noise_std
        self.rng = rng

    def draw_labels(self, table: np.ndarray) -> List[int]:
        n = int(self.rng.integers(self.objects[0], self.objects[1] + 1))
        return [int(c) for c in self.rng.choice(len(table), n, p=table)]

    def _place(self, size: int, boxes: List[List[int]]) -> List[int]:
        limit = self.img_size - size
        for _ in range(50):
            x, y = (int(v) for v in self.rng.integers(0, limit + 1, 2))
            if all(x + size <= bx or bx + bw <= x or y + size <= by
                   or by + bh <= y for bx, by, bw, bh in boxes):
                return [x, y, size, size]
        return [x, y, size, size]  # crowded: allow an overlap

    def render(self, labels: Sequence[int],
               scans: Sequence[np.ndarray]) -> Tuple[np.ndarray, List]:
        """Render one scene.

        Returns:
            tuple: (H x W x 3 uint8 image, [x, y, w, h] boxes).
        """
        from PIL import Image
        canvas = np.zeros((self.img_size, self.img_size), np.float32)
        boxes: List[List[int]] = []
        for c in labels:
            pool = scans[c]
            scan = pool[int(self.rng.integers(len(pool)))]
            size = int(self.rng.integers(self.digit_size[0],
                                         self.digit_size[1] + 1))
            patch = np.asarray(
                Image.fromarray((scan * 255).astype(np.uint8)).resize(
                    (size, size), Image.BILINEAR), np.float32) / 255.0
            patch *= float(self.rng.uniform(0.55, 1.0))
            box = self._place(size, boxes)
            x, y = box[0], box[1]
            region = canvas[y:y + size, x:x + size]
            np.maximum(region, patch, out=region)
            boxes.append(box)
        canvas += self.rng.normal(0.0, self.noise_std, canvas.shape)
        tint = self.rng.uniform(0.7, 1.0, 3)
        rgb = np.clip(canvas[..., None] * tint, 0, 1)
        return (rgb * 255).round().astype(np.uint8), boxes


def _coco_dict(images: List[Dict], anns: List[Dict]) -> Dict:
    return dict(
        images=images,
        annotations=anns,
        categories=[
            dict(id=k + 1, name=name, supercategory='digit')
            for k, name in enumerate(CLASSES)
        ])


def make_context_shift(out_dir: str,
                       seed: int = 0,
                       num_train: int = 2000,
                       num_val_per_site: int = 300,
                       img_size: int = 128,
                       digit_size: Tuple[int, int] = (14, 22),
                       objects: Tuple[int, int] = (2, 6),
                       noise_std: float = 0.12,
                       scenes: Optional[Dict] = None,
                       overwrite: bool = False,
                       progress: bool = True) -> Dict:
    """Write the benchmark (images, COCO annotations, priors) to a folder.

    The folder is written under a temporary name and renamed at the end:
    an interrupted run leaves no half-written benchmark.

    Args:
        out_dir (str): the folder to create.
        seed (int): the only source of randomness.
        num_train (int): train images.
        num_val_per_site (int): val images per deployment site.
        img_size (int): image side.
        digit_size (tuple[int, int]): min / max digit side.
        objects (tuple[int, int]): min / max objects per image.
        noise_std (float): pixel noise std (0-1 scale).
        scenes (dict, optional): the scene model; default
            :data:`DEFAULT_SCENES`.
        overwrite (bool): replace an existing folder.
        progress (bool): show a progress bar.

    Returns:
        dict: the metadata written to ``meta.json`` (knobs, counts and the
        epsilon of every site's prior against E_t).
    """
    from PIL import Image

    from ..priors import batch_prior, prior_mae, save_prior
    scenes = check_scene_model(copy.deepcopy(scenes or DEFAULT_SCENES))
    out_dir = osp.abspath(out_dir)
    if osp.exists(out_dir) and not overwrite:
        raise ValueError(f'{out_dir} exists (pass overwrite=True / '
                         '--overwrite to replace it)')
    tmp = out_dir + '.partial'
    if osp.exists(tmp):
        shutil.rmtree(tmp)
    rng = np.random.default_rng(seed)
    train_scans, val_scans = load_digits_split(seed=seed)
    renderer = SceneRenderer(img_size, tuple(digit_size), tuple(objects),
                             noise_std, rng)
    jobs = [('train', None, num_train)] + [
        ('val', site, num_val_per_site) for site in scenes['sites']
    ]
    total = sum(n for _, _, n in jobs)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc='rendering scenes', unit=' images')
    splits: Dict[str, Dict] = {}
    try:
        for split, site, count in jobs:
            if split == 'train':
                types = scenes['scene_types']
                mixture = scenes['train_mixture']
                scans, key, folder = train_scans, 'train', 'train'
            else:
                spec = scenes['sites'][site]
                types = dict(scenes['scene_types'],
                             **spec.get('scene_types', {}))
                mixture = spec['mixture']
                scans, key, folder = val_scans, f'val_{site}', 'val'
            names = list(mixture)
            weights = _normalise(list(mixture.values()), key)
            os.makedirs(osp.join(tmp, 'images', folder), exist_ok=True)
            images, anns, label_lists = [], [], []
            for k in range(count):
                scene = names[int(rng.choice(len(names), p=weights))]
                table = _normalise(types[scene], scene)
                labels = renderer.draw_labels(table)
                pixels, boxes = renderer.render(labels, scans)
                stem = f'{key}_{k:06d}'
                file_name = f'{folder}/{stem}.png'
                Image.fromarray(pixels).save(
                    osp.join(tmp, 'images', file_name))
                img_id = len(images) + 1
                images.append(
                    dict(id=img_id, file_name=file_name, width=img_size,
                         height=img_size, scene_type=scene))
                for c, box in zip(labels, boxes):
                    anns.append(
                        dict(id=len(anns) + 1, image_id=img_id,
                             category_id=c + 1, bbox=box,
                             area=box[2] * box[3], iscrowd=0))
                label_lists.append(labels)
                if bar is not None:
                    bar.update(1)
            splits[key] = dict(images=images, anns=anns, labels=label_lists)
    finally:
        if bar is not None:
            bar.close()
    os.makedirs(osp.join(tmp, 'annotations'))
    os.makedirs(osp.join(tmp, 'priors'))
    e_t = batch_prior(len(CLASSES), splits['train']['labels'])
    # images per class: the post-hoc marginal re-weighting baseline needs
    # the training class frequencies beside E_t
    present = np.zeros(len(CLASSES), np.int64)
    for labels in splits['train']['labels']:
        present[np.unique(np.asarray(labels, np.int64))] += 1
    save_prior(
        osp.join(tmp, 'priors', 'E_t.json'), e_t, CLASSES,
        source='context-shift train', num_images=num_train,
        images_per_class={c: int(n) for c, n in zip(CLASSES, present)})
    meta = dict(
        seed=seed, num_train=num_train, num_val_per_site=num_val_per_site,
        img_size=img_size, digit_size=list(digit_size),
        objects=list(objects), noise_std=noise_std, scenes=scenes,
        classes=list(CLASSES), lookalikes=[list(p) for p in LOOKALIKES],
        epsilon={})
    all_val_images, all_val_anns = [], []
    for key, data in splits.items():
        with open(osp.join(tmp, 'annotations', f'instances_{key}.json'),
                  'w') as f:
            json.dump(_coco_dict(data['images'], data['anns']), f)
        if key == 'train':
            continue
        site = key[len('val_'):]
        e_site = batch_prior(len(CLASSES), data['labels'])
        save_prior(
            osp.join(tmp, 'priors', f'E_{site}.json'), e_site, CLASSES,
            source=f'context-shift val site {site}',
            num_images=len(data['labels']))
        meta['epsilon'][site] = prior_mae(e_site, e_t)
        offset_img, offset_ann = len(all_val_images), len(all_val_anns)
        for img in data['images']:
            all_val_images.append(dict(img, id=img['id'] + offset_img,
                                       site=site))
        for ann in data['anns']:
            all_val_anns.append(
                dict(ann, id=ann['id'] + offset_ann,
                     image_id=ann['image_id'] + offset_img))
    with open(osp.join(tmp, 'annotations', 'instances_val.json'), 'w') as f:
        json.dump(_coco_dict(all_val_images, all_val_anns), f)
    e_v = batch_prior(
        len(CLASSES),
        [lab for key, d in splits.items() if key != 'train'
         for lab in d['labels']])
    save_prior(osp.join(tmp, 'priors', 'E_v.json'), e_v, CLASSES,
               source='context-shift val (all sites)')
    meta['epsilon']['all_sites'] = prior_mae(e_v, e_t)
    with open(osp.join(tmp, 'classes.txt'), 'w') as f:
        f.write('\n'.join(CLASSES) + '\n')
    with open(osp.join(tmp, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    if osp.exists(out_dir):
        old = out_dir + '.old'
        if osp.exists(old):
            shutil.rmtree(old)
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out_dir)
    return meta
