# Copyright (c) mmcalidet contributors. All rights reserved.
"""Simulated deployment sites of a labelled image set, and the
recipe-selection (validation) sites built from them.

A deployment site is a population whose class relations differ from the
training set's. A *simulated site* is a subpopulation of a labelled image
set defined by its labels only:

- ``('with', c)``: the images that show class ``c``;
- ``('without', c)``: the images that do not;
- ``('tilt', seed)``: a random tilt of the class mixture, the images
  re-sampled with weight ``exp(sum of z_c over the image's classes)``,
  ``z ~ N(0, tilt_std^2)`` per class;
- ``('pairs', seed)``: a tilt of which classes go together, each class's
  frequency held: one to three random pairs of classes that the set shows
  together favoured ``pair_strength``-fold (:func:`pair_tilt_weights`),
  the images re-sampled with those weights.

:class:`SimulatedSites` gives their members and statistics;
:func:`validation_sites` and :func:`make_validation_data` build the
recipe-selection folder (``tools/make_data.py --validation-sites``), and
``tools/prior_signal.py`` draws tilted sites. The rejected site-simulated
training recipe built on them is in
``projects/context_shift/experiments/site_simulation/``.
"""
import math
from collections import OrderedDict
from typing import Dict, List, Sequence, Tuple

import numpy as np

from mmcalidet.priors import batch_prior
from mmcalidet.utils.validation import check_float

SITE_KINDS = ('with', 'without', 'tilt', 'pairs')

SiteKey = Tuple[str, int]


def dataset_label_lists(dataset) -> List[np.ndarray]:
    """The ground-truth classes of every image of a dataset (crowd and
    ignored boxes left out).

    Args:
        dataset: an mmdet dataset (``get_data_info`` with ``instances``)
            or a ``DecoderCacheDataset`` (its cache's labels).

    Returns:
        list[np.ndarray]: int64 class indices per image.
    """
    cache = getattr(dataset, 'cache', None)
    if cache is not None and hasattr(cache, 'gt_label_lists'):
        return cache.gt_label_lists()
    lists = []
    for index in range(len(dataset)):
        instances = dataset.get_data_info(index).get('instances', [])
        lists.append(
            np.array([
                inst['bbox_label']
                for inst in instances if not inst.get('ignore_flag', 0)
            ],
                     dtype=np.int64))
    return lists


class SimulatedSites:
    """Simulated deployment sites of a labelled image set: which images
    each holds and its statistics.

    Args:
        label_lists (Sequence[np.ndarray]): class indices per image.
        num_classes (int): K.
        kinds (Sequence[str]): the kinds drawn (see :data:`SITE_KINDS`),
            with equal probability. Defaults to ``with``, ``without`` and
            ``tilt`` (the site-simulated recipe's).
        min_images (int): a ``with`` / ``without`` site of fewer images
            is never drawn.
        tilt_std (float): sigma of a tilt's per-class log weights.
        tilt_fraction (float): a tilted (or pair-tilted) site's size, as a
            share of the set.
        pair_strength (float): how much a ``pairs`` site favours its
            pairs (the start weight of :func:`pair_tilt_weights`).
        cache_size (int): statistics kept for this many sites.
    """

    def __init__(self,
                 label_lists: Sequence[np.ndarray],
                 num_classes: int,
                 kinds: Sequence[str] = ('with', 'without', 'tilt'),
                 min_images: int = 32,
                 tilt_std: float = 1.0,
                 tilt_fraction: float = 0.25,
                 pair_strength: float = 4.0,
                 cache_size: int = 256) -> None:
        unknown = sorted(set(kinds) - set(SITE_KINDS))
        if unknown or not kinds:
            raise ValueError(f'SimulatedSites: kinds must be a non-empty '
                             f'subset of {SITE_KINDS}, got {list(kinds)}')
        tilt_fraction = check_float(
            'SimulatedSites: tilt_fraction', tilt_fraction, low=0, high=1,
            low_open=True)
        tilt_std = check_float('SimulatedSites: tilt_std', tilt_std, low=0)
        pair_strength = check_float(
            'SimulatedSites: pair_strength', pair_strength, low=0,
            low_open=True)
        self.num_classes = int(num_classes)
        self.label_lists = [np.asarray(x, dtype=np.int64) for x in label_lists]
        num = len(self.label_lists)
        #: presence (N, K)
        self.presence = np.zeros((num, self.num_classes), dtype=bool)
        for k, labels in enumerate(self.label_lists):
            if labels.size and (labels.min() < 0
                                or labels.max() >= self.num_classes):
                raise ValueError(
                    f'SimulatedSites: image {k} has a class outside '
                    f'0..{self.num_classes - 1}: {labels.tolist()}')
            self.presence[k, labels] = True
        self.kinds = tuple(kinds)
        self.min_images = int(min_images)
        self.tilt_std = float(tilt_std)
        self.tilt_fraction = float(tilt_fraction)
        self.pair_strength = float(pair_strength)
        counts = self.presence.sum(0)
        together = np.triu(
            self.presence.T.astype(np.float64) @ self.presence, 1)
        #: the class pairs some image shows together (a ``pairs`` site's)
        self.seen_pairs = np.argwhere(together > 0)
        #: the classes whose ``with`` / ``without`` sites are large enough
        self.classes_for = {
            'with': np.flatnonzero(counts >= self.min_images),
            'without': np.flatnonzero(num - counts >= self.min_images)
        }
        self.classes_for['pairs'] = np.arange(len(self.seen_pairs))
        self.kinds = tuple(k for k in self.kinds
                           if k == 'tilt' or len(self.classes_for[k]))
        if not self.kinds:
            raise ValueError(
                f'SimulatedSites: no class has {self.min_images} images with '
                'and without it; lower min_images or add the "tilt" kind')
        self._cache: 'OrderedDict[SiteKey, Tuple]' = OrderedDict()
        self._cache_size = int(cache_size)

    def draw_key(self, rng: np.random.Generator) -> SiteKey:
        """Draw a site: a kind, then its class or its tilt's seed.

        Args:
            rng (np.random.Generator): the generator drawn from.

        Returns:
            tuple[str, int]: the site's key.
        """
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        if kind in ('tilt', 'pairs'):
            return kind, int(rng.integers(2**31))
        classes = self.classes_for[kind]
        return kind, int(classes[int(rng.integers(len(classes)))])

    def members(self, key: SiteKey) -> np.ndarray:
        """The images of a site (sorted indices)."""
        return self._site(key)[0]

    def statistics(self, key: SiteKey) -> np.ndarray:
        """E_site: the relation statistics of all the site's images (K x K
        float32)."""
        return self._site(key)[1]

    def _site(self, key: SiteKey) -> Tuple[np.ndarray, np.ndarray]:
        key = (str(key[0]), int(key[1]))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        kind, value = key
        if kind == 'with':
            members = np.flatnonzero(self.presence[:, value])
        elif kind == 'without':
            members = np.flatnonzero(~self.presence[:, value])
        elif kind == 'tilt':
            members = self._tilted(value)
        elif kind == 'pairs':
            members = self._pair_tilted(value)
        else:
            raise KeyError(f'unknown site kind {kind!r}; one of {SITE_KINDS}')
        stats = batch_prior(self.num_classes,
                            [self.label_lists[i] for i in members])
        site = (members, stats.astype(np.float32))
        self._cache[key] = site
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return site

    def _tilted(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        log_w = self.presence @ rng.normal(0.0, self.tilt_std,
                                           self.num_classes)
        weights = np.exp(log_w - log_w.max())
        num = len(self.label_lists)
        size = min(num, max(1, int(math.ceil(self.tilt_fraction * num))))
        return np.sort(
            rng.choice(
                num, size=size, replace=False, p=weights / weights.sum()))

    def site_pairs(self, seed: int) -> np.ndarray:
        """The (P, 2) class pairs a ``('pairs', seed)`` site favours: one
        to three of :attr:`seen_pairs`."""
        if not len(self.seen_pairs):
            raise ValueError('SimulatedSites: no image shows two classes, '
                             'so there is no pair to tilt')
        rng = np.random.default_rng([seed, 2])
        num = min(int(rng.integers(1, 4)), len(self.seen_pairs))
        return self.seen_pairs[np.sort(
            rng.choice(len(self.seen_pairs), size=num, replace=False))]

    def _pair_tilted(self, seed: int) -> np.ndarray:
        weights = pair_tilt_weights(self.presence,
                                    [tuple(p) for p in self.site_pairs(seed)],
                                    strength=self.pair_strength)
        rng = np.random.default_rng(seed)
        num = len(self.label_lists)
        size = min(int((weights > 0).sum()),
                   max(1, int(math.ceil(self.tilt_fraction * num))))
        return np.sort(rng.choice(num, size=size, replace=False, p=weights))


#: the simulated sites of a recipe-selection set, in the order they are
#: filled (each takes its images before the next)
VALIDATION_SITES = ('sim_rare_pairs', 'sim_without', 'sim_tilt',
                    'sim_like_train', 'sim_pairs')


def pair_tilt_weights(presence: np.ndarray,
                      pairs: Sequence[Tuple[int, int]],
                      strength: float = 4.0,
                      max_iter: int = 500,
                      tol: float = 1e-8) -> np.ndarray:
    """Per-image weights that tilt which classes occur together while every
    class's image frequency stays at the pool's.

    The images holding one of ``pairs`` start at weight ``strength``, the
    others at 1; iterative proportional fitting then rescales, class by
    class, the images with and without the class so that the weighted share
    of images holding it equals its unweighted share in the pool (the
    uniform weights satisfy every margin, so the fit exists).

    Args:
        presence (np.ndarray): (N, K) bool, the classes of each pool image.
        pairs (Sequence[tuple[int, int]]): the class pairs to favour.
        strength (float): the start weight of an image with such a pair
            (> 0; above 1 favours the pairs, below 1 disfavours them).
        max_iter (int): the most IPF sweeps over the classes.
        tol (float): stop when no class's weighted frequency is further
            than this from its target.

    Returns:
        np.ndarray: (N,) weights summing to 1.
    """
    presence = np.asarray(presence)
    if presence.ndim != 2 or presence.dtype != bool or not len(presence):
        raise ValueError('presence must be a non-empty (N, K) bool array, '
                         f'got {presence.dtype} {presence.shape}')
    num_classes = presence.shape[1]
    if not pairs:
        raise ValueError('pair_tilt_weights needs at least one class pair')
    for pair in pairs:
        if len(pair) != 2 or pair[0] == pair[1] or not all(
                0 <= int(c) < num_classes for c in pair):
            raise ValueError(f'a pair must be two different classes in '
                             f'[0, {num_classes}), got {pair!r}')
    if not (np.isfinite(strength) and strength > 0):
        raise ValueError(f'strength must be a positive number, got '
                         f'{strength!r}')
    if max_iter < 1 or not tol > 0:
        raise ValueError('max_iter must be >= 1 and tol > 0')
    has_pair = np.zeros(len(presence), dtype=bool)
    for a, b in pairs:
        has_pair |= presence[:, a] & presence[:, b]
    weights = np.where(has_pair, float(strength), 1.0)
    weights /= weights.sum()
    target = presence.mean(0)
    for _ in range(max_iter):
        for c in range(num_classes):
            if target[c] in (0.0, 1.0):
                continue  # every weighting holds it
            now = weights[presence[:, c]].sum()
            weights = np.where(presence[:, c], weights * target[c] / now,
                               weights * (1 - target[c]) / (1 - now))
        if np.abs(weights @ presence - target).max() <= tol:
            break
    return weights / weights.sum()


def validation_sites(pool_labels: Sequence[np.ndarray],
                     train_labels: Sequence[np.ndarray],
                     num_classes: int,
                     per_site: int = 300,
                     seed: int = 0,
                     tilt_std: float = 1.0) -> Dict[str, Dict]:
    """Simulated deployment sites on held-out images of the training
    distribution, for choosing a training recipe without the val sites.

    Each site is defined from the *training* labels only, and takes up to
    ``per_site`` images of the pool that no earlier site took:

    - ``sim_rare_pairs``: images holding a pair of classes that rarely go
      together in training (both ``E_t[a, b]`` and ``E_t[b, a]`` at most
      the off-diagonal's 25th percentile);
    - ``sim_without``: images without the class whose absence moves the
      training statistics most (mean |E(without c) - E_t|);
    - ``sim_tilt``: a random tilt of the class mixture (see
      :class:`SimulatedSites`);
    - ``sim_like_train``: a random draw (the null site);
    - ``sim_pairs``: a tilt of which classes go together: three random
      pairs of classes that the remaining pool shows together are favoured
      4-fold, each class's image frequency held at the remaining pool's by
      :func:`pair_tilt_weights`, and the images drawn by those weights.
      It comes last, so the earlier sites are those of before it.

    Args:
        pool_labels (Sequence[np.ndarray]): class indices per pool image.
        train_labels (Sequence[np.ndarray]): the training set's.
        num_classes (int): K.
        per_site (int): the most images a site takes.
        seed (int): seed of the tilt and the random draws.
        tilt_std (float): sigma of the tilt's per-class log weights.

    Returns:
        dict: per site (in :data:`VALIDATION_SITES` order, empty ones left
        out) ``dict(members=<sorted pool indices>, rule=<what defines
        it>)``.
    """
    from mmcalidet.priors import prior_mae
    e_t = batch_prior(num_classes, train_labels)
    train = SimulatedSites(train_labels, num_classes, min_images=1)
    pool = SimulatedSites(pool_labels, num_classes, min_images=1)
    rng = np.random.default_rng(seed)
    free = np.ones(len(pool_labels), dtype=bool)

    def take(candidates: np.ndarray, weights=None) -> np.ndarray:
        candidates = candidates[free[candidates]]
        size = min(per_site, len(candidates))
        p = None if weights is None else \
            weights[candidates] / weights[candidates].sum()
        chosen = np.sort(rng.choice(candidates, size=size, replace=False, p=p))
        free[chosen] = False
        return chosen

    off = ~np.eye(num_classes, dtype=bool)
    low = np.quantile(e_t[off], 0.25)
    rare = (e_t <= low) & (e_t.T <= low) & off
    pairs = [(a, b) for a, b in zip(*np.nonzero(rare)) if a < b]
    has_pair = np.zeros(len(pool_labels), dtype=bool)
    for a, b in pairs:
        has_pair |= pool.presence[:, a] & pool.presence[:, b]
    shifts = {
        c: prior_mae(train.statistics(('without', c)), e_t)
        for c in train.classes_for['without']
    }
    dropped = max(shifts, key=shifts.get)
    z = rng.normal(0.0, tilt_std, num_classes)
    tilt = np.exp(pool.presence @ z - (pool.presence @ z).max())
    everyone = np.arange(len(pool_labels))
    sites = {
        'sim_rare_pairs': (take(np.flatnonzero(has_pair)),
                           f'a pair of rarely co-occurring classes '
                           f'({len(pairs)} pairs)'),
        'sim_without': (take(np.flatnonzero(~pool.presence[:, dropped])),
                        f'without class {dropped}'),
        'sim_tilt': (take(everyone, tilt), 'a tilt of the class mixture'),
        'sim_like_train': (take(everyone), 'a random draw'),
    }
    rest = np.flatnonzero(free)
    together = pool.presence[rest].T.astype(float) @ pool.presence[rest]
    seen = [(a, b) for a, b in zip(*np.nonzero(np.triu(together, 1)))]
    if seen:
        chosen = [
            seen[k] for k in np.sort(
                rng.choice(len(seen), size=min(3, len(seen)), replace=False))
        ]
        weights = np.zeros(len(pool_labels))
        weights[rest] = pair_tilt_weights(pool.presence[rest], chosen)
        members = take(rest[weights[rest] > 0], weights)
        sites['sim_pairs'] = (members, 'pairs {} favoured 4-fold, class '
                              'frequencies held'.format(', '.join(
                                  f'{a}-{b}' for a, b in chosen)))
    return {
        name: dict(members=members, rule=rule)
        for name, (members, rule) in sites.items() if len(members)
    }


def make_validation_data(out_dir: str,
                         seed: int = 0,
                         pool_size: int = 1600,
                         per_site: int = 300,
                         **data_cfg) -> Dict:
    """A benchmark folder for choosing a training recipe: the training
    split of :func:`~.data.make_context_shift` with these settings, and as
    its val split :func:`validation_sites` on ``pool_size`` new images of
    the *training* mixture (the held-out digit scans), not the scene
    model's deployment sites.

    The sites are written into the generator's temporary folder before it
    is renamed into place: a failed or killed run leaves no folder that
    looks finished (nor its ``.partial`` folder once the next run starts).

    Args:
        out_dir (str): the folder to create.
        seed (int): the data seed.
        pool_size (int): images drawn for the sites.
        per_site (int): the most images a site takes.
        **data_cfg: other :func:`~.data.make_context_shift` arguments
            (``variant``, ``num_train``, ``scenes``, ...).

    Returns:
        dict: the folder's ``meta.json``.
    """
    from .data import DEFAULT_SCENES, MANY_CLASS_SCENES, make_context_shift
    variant = data_cfg.get('variant', 'digits')
    scenes = data_cfg.pop('scenes', None) or (
        MANY_CLASS_SCENES if variant == 'many-class' else DEFAULT_SCENES)
    scenes = dict(
        scenes, sites=dict(pool=dict(mixture=scenes['train_mixture'])))
    return make_context_shift(
        out_dir,
        seed=seed,
        num_val_per_site=pool_size,
        scenes=scenes,
        before_commit=lambda folder, meta: _write_validation_sites(
            folder, meta, seed, per_site),
        **data_cfg)


def _write_validation_sites(folder: str, meta: Dict, seed: int,
                            per_site: int) -> None:
    """Replace the ``pool`` site of a generated folder by
    :func:`validation_sites` on its images: their annotation files and
    priors, and ``meta``'s epsilons, ``validation_sites`` and
    ``num_val_per_site``.

    Args:
        folder (str): the folder being generated (not yet in place).
        meta (dict): its metadata, changed here (written after).
        seed (int): the data seed.
        per_site (int): the most images a site takes.
    """
    import json
    import os
    import os.path as osp

    from mmcalidet.priors import load_prior, prior_mae, save_prior
    from mmcalidet.priors.label_io import read_coco_labels
    ann_dir = osp.join(folder, 'annotations')

    def read(name):
        with open(osp.join(ann_dir, name)) as f:
            return json.load(f)

    pool = read('instances_val.json')
    train_labels = read_coco_labels(
        osp.join(ann_dir, 'instances_train.json')).label_lists()
    pool_labels = read_coco_labels(osp.join(
        ann_dir, 'instances_val.json')).label_lists()
    num_classes = meta['num_classes']
    sites = validation_sites(
        pool_labels, train_labels, num_classes, per_site=per_site, seed=seed)
    e_t = load_prior(osp.join(folder, 'priors', 'E_t.json'))
    site_of = {}
    meta['epsilon'], meta['validation_sites'] = {}, {}
    for site, spec in sites.items():
        images = [pool['images'][k] for k in spec['members']]
        ids = {img['id'] for img in images}
        for img in images:
            site_of[img['id']] = site
        coco = dict(
            pool,
            images=[dict(img, site=site) for img in images],
            annotations=[
                a for a in pool['annotations'] if a['image_id'] in ids
            ])
        with open(osp.join(ann_dir, f'instances_val_{site}.json'), 'w') as f:
            json.dump(coco, f)
        e_site = batch_prior(num_classes,
                             [pool_labels[k] for k in spec['members']])
        save_prior(
            osp.join(folder, 'priors', f'E_{site}.json'),
            e_site,
            meta['classes'],
            source=f'context-shift validation site {site}: {spec["rule"]}',
            num_images=len(images))
        meta['epsilon'][site] = prior_mae(e_site, e_t)
        meta['validation_sites'][site] = dict(
            rule=spec['rule'], images=len(images))
    pool['images'] = [
        dict(img, site=site_of[img['id']]) for img in pool['images']
        if img['id'] in site_of
    ]
    pool['annotations'] = [
        a for a in pool['annotations'] if a['image_id'] in site_of
    ]
    with open(osp.join(ann_dir, 'instances_val.json'), 'w') as f:
        json.dump(pool, f)
    os.remove(osp.join(ann_dir, 'instances_val_pool.json'))
    os.remove(osp.join(folder, 'priors', 'E_pool.json'))
    meta['statistics'].pop('val_pool', None)
    meta['num_val_per_site'] = per_site
