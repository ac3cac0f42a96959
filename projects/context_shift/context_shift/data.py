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

Two variants (``variant=``):

* ``digits`` (the default): 10 digit classes, 2-6 objects per image
  (about 2.9 of 10 classes per image: 29 % of the columns of an image's
  E_x differ from E0).
* ``many-class``: class statistics like COCO's (2.9 of 80 classes per
  image, 3.7 % of E_x's columns off E0). Classes are digit x colour
  *style* (default 10 x 4 = 40: ``zero_red`` ... ``nine_blue``), 2-4
  objects of distinct classes per image (3 of 40: 7.5 %). Two styles are
  look-alikes (``red`` / ``orange``: close hues, each object's hue
  jittered, so that the two overlap) and sit in different scene types;
  the other two (``green``, ``blue``) are plainly distinct and tell the
  scene type, hence which of a look-alike pair an object is. The scene
  model (:data:`MANY_CLASS_SCENES`) holds the styles' hues and its tables
  name classes by pattern (``'*_red'``).
"""
import colorsys
import copy
import fnmatch
from typing import (Callable, Dict, Iterator, List, NamedTuple, Optional,
                    Sequence, Tuple, Union)

import numpy as np

from mmcalidet.utils.progress import progress_bar
from .data_writer import BenchmarkWriter, disk_full_error, label_statistics

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
        # a relation site: both members of the look-alike pair (1, 7)
        # occur, each in the other group's context (7 among the left
        # digits, 1 among the right ones), with training's mixture, so the
        # class frequencies stay near training's and only the relations
        # tell the pair apart
        'swapped': {
            'mixture': {'swapped_left': 0.45, 'swapped_right': 0.45,
                        'mixed': 0.10},
            'scene_types': {
                'swapped_left': [2, 0, 1, 4, 4, 4, 0, 4, 0, 0],
                'swapped_right': [0, 4, 1, 0, 0, 0, 4, 0, 4, 4],
            },
        },
    },
}


#: the generator's variants (see the module docstring)
VARIANTS = ('digits', 'many-class')

#: the many-class variant's scene model: classes are ``<digit>_<style>``
#: (style-major: all ``*_red`` first), tables are dicts of class name or
#: fnmatch pattern -> weight (later keys override earlier ones; unnamed
#: classes weigh 0)
MANY_CLASS_SCENES: Dict = {
    # the styles and their hues in degrees (HSV); each object's hue is
    # drawn around its style's (``hue_jitter``)
    'styles': {'red': 8.0, 'orange': 20.0, 'green': 120.0, 'blue': 225.0},
    # styles that look alike (documentation; they are placed in different
    # scene types)
    'lookalikes': [['red', 'orange']],
    'scene_types': {
        'left': {'*_red': 1, '*_green': 1},
        'right': {'*_orange': 1, '*_blue': 1},
        'mixed': {'*': 1},
    },
    'train_mixture': {'left': 0.45, 'right': 0.45, 'mixed': 0.10},
    'sites': {
        'like_train': {'mixture': {'left': 0.45, 'right': 0.45,
                                   'mixed': 0.10}},
        'left_only': {'mixture': {'left': 1.0}},
        # the look-alikes with the other group's distinct style
        'crossed': {
            'mixture': {'crossed_red': 0.5, 'crossed_orange': 0.5},
            'scene_types': {
                'crossed_red': {'*_red': 1, '*_blue': 1},
                'crossed_orange': {'*_orange': 1, '*_green': 1},
            },
        },
        # the relation site (as ``crossed`` here: both look-alike styles
        # occur, each with the other group's distinct style, at training's
        # class frequencies)
        'swapped': {
            'mixture': {'swapped_red': 0.5, 'swapped_orange': 0.5},
            'scene_types': {
                'swapped_red': {'*_red': 1, '*_blue': 1},
                'swapped_orange': {'*_orange': 1, '*_green': 1},
            },
        },
    },
}

#: per-variant defaults of the knobs that differ
VARIANT_DEFAULTS: Dict[str, Dict] = {
    'digits': dict(objects=(2, 6), scenes=DEFAULT_SCENES),
    'many-class': dict(objects=(2, 4), scenes=MANY_CLASS_SCENES,
                       hue_jitter=8.0),
}


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f'unknown variant {variant!r}; choose from '
                         f'{", ".join(VARIANTS)}')
    return variant


def variant_classes(variant: str = 'digits',
                    scenes: Optional[Dict] = None) -> Tuple[str, ...]:
    """The class names of a variant.

    Args:
        variant (str): one of :data:`VARIANTS`.
        scenes (dict, optional): the scene model (its ``styles`` make the
            many-class variant's classes); default the variant's.

    Returns:
        tuple[str]: ``CLASSES`` for ``digits``; ``<digit>_<style>`` for
        every style (in the model's order), then every digit, for
        ``many-class``.
    """
    if _check_variant(variant) == 'digits':
        return CLASSES
    styles = (scenes or MANY_CLASS_SCENES).get('styles')
    if not isinstance(styles, dict) or not styles:
        raise ValueError('the many-class scene model needs "styles" (a '
                         'dict of style name -> hue in degrees)')
    return tuple(f'{digit}_{style}' for style in styles for digit in CLASSES)


def _table_weights(table: Union[Sequence[float], Dict[str, float]],
                   classes: Sequence[str], what: str) -> np.ndarray:
    """A scene table as normalised class weights.

    Args:
        table (list | dict): one weight per class, or class name / fnmatch
            pattern -> weight (later keys override earlier ones).
        classes (Sequence[str]): the class names.
        what (str): name used in error messages.

    Returns:
        np.ndarray: (K,) weights summing to 1.
    """
    if isinstance(table, dict):
        weights = np.zeros(len(classes))
        for key, value in table.items():
            hit = [k for k, name in enumerate(classes)
                   if fnmatch.fnmatchcase(name, key)]
            if not hit:
                raise ValueError(f'{what}: {key!r} names no class')
            if not isinstance(value, (int, float)) or isinstance(
                    value, bool):
                raise ValueError(f'{what}: the weight of {key!r} must be a '
                                 f'number, got {value!r}')
            weights[hit] = value
        return _normalise(weights, what)
    if len(table) != len(classes):
        raise ValueError(f'{what}: {len(table)} weights, expected '
                         f'{len(classes)}')
    return _normalise(table, what)


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


def check_scene_model(scenes: Dict, variant: str = 'digits') -> Dict:
    """Validate a scene model (the structure of :data:`DEFAULT_SCENES`, or
    of :data:`MANY_CLASS_SCENES` for the many-class variant).

    Args:
        scenes (dict): the model.
        variant (str): one of :data:`VARIANTS`.

    Returns:
        dict: the model, unchanged.
    """
    if not isinstance(scenes, dict):
        raise ValueError('a scene model must be a dict')
    if _check_variant(variant) == 'many-class':
        styles = scenes.get('styles')
        if not isinstance(styles, dict) or not styles or not all(
                isinstance(h, (int, float)) and not isinstance(h, bool)
                for h in styles.values()):
            raise ValueError('the many-class scene model needs "styles": a '
                             'dict of style name -> hue in degrees')
        for pair in scenes.get('lookalikes', []):
            for style in pair:
                if style not in styles:
                    raise ValueError(f'lookalikes: unknown style {style!r}')
    elif 'styles' in scenes:
        raise ValueError('"styles" belongs to the many-class variant '
                         '(--variant many-class)')
    classes = variant_classes(variant, scenes)
    types = scenes.get('scene_types')
    if not isinstance(types, dict) or not types:
        raise ValueError('scene model needs "scene_types"')
    for name, table in types.items():
        _table_weights(table, classes, f'scene type {name!r}')

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
            _table_weights(table, classes,
                           f'site {site!r}, scene type {name!r}')
        check_mixture(spec.get('mixture'), known, f'site {site!r}')
    return scenes


def _mixture_tables(scenes: Dict, site: Optional[str],
                    classes: Sequence[str]) -> List[Tuple[float, np.ndarray]]:
    """(weight, normalised class table) per scene type of a site's mixture
    (``site=None``: the training mixture)."""
    if site is None:
        mixture, types = scenes['train_mixture'], scenes['scene_types']
    else:
        if site not in scenes['sites']:
            raise ValueError(f'unknown site {site!r}; the scene model has '
                             f'{", ".join(scenes["sites"])}')
        spec = scenes['sites'][site]
        mixture = spec['mixture']
        types = dict(scenes['scene_types'], **spec.get('scene_types', {}))
    weights = _normalise(list(mixture.values()), 'mixture')
    return [(float(w), _table_weights(types[name], classes, name))
            for w, name in zip(weights, mixture)]


def _absent_probability(p: np.ndarray, objects: Tuple[int, int]) -> np.ndarray:
    """E[(1 - p)^n] for n uniform on ``objects`` (inclusive)."""
    counts = np.arange(objects[0], objects[1] + 1)
    return np.mean(np.clip(1.0 - p, 0.0, 1.0)[..., None]**counts, axis=-1)


def expected_site_statistics(site: Optional[str] = None,
                             variant: str = 'digits',
                             scenes: Optional[Dict] = None,
                             objects: Optional[Tuple[int, int]] = None
                             ) -> Dict[str, np.ndarray]:
    """A site's expected class statistics, computed from the scene model
    (no images drawn).

    Each image draws a scene type from the site's mixture, then n objects
    (uniform on ``objects``) independently from that type's class table.

    Args:
        site (str, optional): a site of the scene model; None for the
            training distribution.
        variant (str): one of :data:`VARIANTS`.
        scenes (dict, optional): the scene model; the variant's default
            when None.
        objects (tuple[int, int], optional): min / max objects per image;
            the variant's default when None.

    Returns:
        dict: ``object_share`` (K,) the expected share of objects per
        class (sums to 1); ``image_frequency`` (K,) the probability that
        an image holds the class; ``cooccurrence`` (K, K) the probability
        that an image holds both classes (diagonal = image frequency).
    """
    defaults = VARIANT_DEFAULTS[_check_variant(variant)]
    scenes = check_scene_model(
        scenes if scenes is not None else defaults['scenes'], variant)
    objects = tuple(objects if objects is not None else defaults['objects'])
    if len(objects) != 2 or not 1 <= objects[0] <= objects[1]:
        raise ValueError(f'objects must satisfy 1 <= min <= max, got '
                         f'{objects}')
    classes = variant_classes(variant, scenes)
    k = len(classes)
    share = np.zeros(k)
    freq = np.zeros(k)
    co = np.zeros((k, k))
    for weight, table in _mixture_tables(scenes, site, classes):
        absent = _absent_probability(table, objects)
        both_absent = _absent_probability(table[:, None] + table[None, :],
                                          objects)
        share += weight * table
        freq += weight * (1.0 - absent)
        co += weight * (1.0 - absent[:, None] - absent[None, :] + both_absent)
    np.fill_diagonal(co, freq)
    return dict(object_share=share, image_frequency=freq, cooccurrence=co)


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


class StyledSceneRenderer(SceneRenderer):
    """Draw and render scenes of the many-class variant: the objects of an
    image have distinct classes, and each is drawn in its class's colour
    style (a hue, jittered per object).

    Args:
        img_size (int): square image size in pixels.
        digit_size (tuple[int, int]): min / max digit box side.
        objects (tuple[int, int]): min / max objects per image.
        noise_std (float): std of the grey Gaussian pixel noise (0-1
            scale).
        rng (np.random.Generator): the random source.
        class_digits (Sequence[int]): the digit (scan pool) of each class.
        class_hues (Sequence[float]): the hue of each class in degrees.
        hue_jitter (float): std of each object's hue around its class's,
            in degrees.
    """

    def __init__(self, img_size: int, digit_size: Tuple[int, int],
                 objects: Tuple[int, int], noise_std: float,
                 rng: np.random.Generator, class_digits: Sequence[int],
                 class_hues: Sequence[float], hue_jitter: float) -> None:
        super().__init__(img_size, digit_size, objects, noise_std, rng)
        if len(class_digits) != len(class_hues):
            raise ValueError('one digit and one hue per class are needed')
        if not hue_jitter >= 0:
            raise ValueError(f'hue_jitter must be >= 0, got {hue_jitter}')
        self.class_digits = [int(d) for d in class_digits]
        self.class_hues = [float(h) for h in class_hues]
        self.hue_jitter = float(hue_jitter)

    def draw_labels(self, table: np.ndarray) -> List[int]:
        """Distinct classes, as many as objects."""
        n = int(self.rng.integers(self.objects[0], self.objects[1] + 1))
        return [
            int(c)
            for c in self.rng.choice(len(table), n, replace=False, p=table)
        ]

    def render(self, labels: Sequence[int],
               scans: Sequence[np.ndarray]) -> Tuple[np.ndarray, List]:
        """Render one scene; ``scans`` are indexed by digit.

        Returns:
            tuple: (H x W x 3 uint8 image, [x, y, w, h] boxes).
        """
        from PIL import Image
        canvas = np.zeros((self.img_size, self.img_size, 3), np.float32)
        boxes: List[List[int]] = []
        for c in labels:
            pool = scans[self.class_digits[c]]
            scan = pool[int(self.rng.integers(len(pool)))]
            size = int(self.rng.integers(self.digit_size[0],
                                         self.digit_size[1] + 1))
            patch = np.asarray(
                Image.fromarray((scan * 255).astype(np.uint8)).resize(
                    (size, size), Image.BILINEAR), np.float32) / 255.0
            patch *= float(self.rng.uniform(0.55, 1.0))
            hue = self.class_hues[c] + float(
                self.rng.normal(0.0, self.hue_jitter))
            colour = np.asarray(
                colorsys.hsv_to_rgb((hue / 360.0) % 1.0,
                                    float(self.rng.uniform(0.75, 1.0)),
                                    1.0), np.float32)
            box = self._place(size, boxes)
            x, y = box[0], box[1]
            region = canvas[y:y + size, x:x + size]
            np.maximum(region, patch[..., None] * colour, out=region)
            boxes.append(box)
        # grey noise: it dims and brightens, it does not shift hues
        canvas += self.rng.normal(0.0, self.noise_std,
                                  canvas.shape[:2])[..., None]
        rgb = np.clip(canvas, 0, 1)
        return (rgb * 255).round().astype(np.uint8), boxes


class SplitJob(NamedTuple):
    """One split for the generator to make: ``train`` or a val site.

    Attributes:
        key (str): ``train`` or ``val_<site>`` (names the split's
            annotation file and image files).
        folder (str): its image folder under ``images/`` (``train`` or
            ``val``).
        count (int): its number of images.
        mixture (dict): scene type -> weight.
        tables (dict): scene type -> normalised class weights.
        scans (Sequence[np.ndarray]): the digit scans by digit (train or
            val appearances).
    """
    key: str
    folder: str
    count: int
    mixture: Dict[str, float]
    tables: Dict[str, np.ndarray]
    scans: Sequence[np.ndarray]


def _scene_tables(
    scenes: Dict, classes: Sequence[str], objects: Tuple[int, int],
    variant: str
) -> Tuple[Dict[str, np.ndarray], Dict[str, Dict[str, np.ndarray]]]:
    """The normalised class table of every scene type, for training and
    for each site (a site's own scene types added to the shared ones).

    Args:
        scenes (dict): the checked scene model.
        classes (Sequence[str]): the class names.
        objects (tuple[int, int]): min / max objects per image.
        variant (str): one of :data:`VARIANTS`.

    Returns:
        tuple[dict, dict]: scene type -> table; site -> (scene type ->
        table).

    Raises:
        ValueError: many-class: a table with fewer classes than the most
            objects of an image (its objects have distinct classes).
    """
    tables = {
        name: _table_weights(table, classes, f'scene type {name!r}')
        for name, table in scenes['scene_types'].items()
    }
    site_tables = {
        site: dict(tables, **{
            name: _table_weights(table, classes, f'scene type {name!r}')
            for name, table in spec.get('scene_types', {}).items()
        })
        for site, spec in scenes['sites'].items()
    }
    if variant == 'many-class':
        # distinct classes per image: every table needs enough of them
        for where, known in [('train', tables)] + list(site_tables.items()):
            for name, table in known.items():
                if np.count_nonzero(table) < objects[1]:
                    raise ValueError(
                        f'scene type {name!r} ({where}) has '
                        f'{np.count_nonzero(table)} classes, fewer than '
                        f'the {objects[1]} distinct objects an image may '
                        'hold')
    return tables, site_tables


def _split_jobs(scenes: Dict, tables: Dict[str, np.ndarray],
                site_tables: Dict[str, Dict[str, np.ndarray]],
                train_scans: Sequence[np.ndarray],
                val_scans: Sequence[np.ndarray], num_train: int,
                num_val_per_site: int) -> List[SplitJob]:
    """The splits to make, in the order their images are drawn: train,
    then every site of the scene model.

    Args:
        scenes (dict): the checked scene model.
        tables (dict): the training scene types' tables.
        site_tables (dict): site -> its scene types' tables.
        train_scans (Sequence[np.ndarray]): the train appearances.
        val_scans (Sequence[np.ndarray]): the val appearances.
        num_train (int): train images.
        num_val_per_site (int): val images per site.

    Returns:
        list[SplitJob]: one per split.
    """
    jobs = [
        SplitJob('train', 'train', num_train, scenes['train_mixture'],
                 tables, train_scans)
    ]
    for site, spec in scenes['sites'].items():
        jobs.append(
            SplitJob(f'val_{site}', 'val', num_val_per_site,
                     spec['mixture'], site_tables[site], val_scans))
    return jobs


def sample_scenes(job: SplitJob, renderer: SceneRenderer,
                  rng: np.random.Generator) -> Iterator[Tuple[str, List[int]]]:
    """Draw the scene type and the object classes of each image of a
    split.

    Lazy, one image at a time: the renderer draws the image's appearances,
    sizes and positions from the same generator, so an image's draws
    must follow the rendering of the image before (a seed's data depends
    on this order).

    Args:
        job (SplitJob): the split.
        renderer (SceneRenderer): draws the classes from a scene type's
            table (:meth:`SceneRenderer.draw_labels`).
        rng (np.random.Generator): the random source (the renderer's).

    Yields:
        tuple[str, list[int]]: the scene type and the class of each
        object.
    """
    names = list(job.mixture)
    weights = _normalise(list(job.mixture.values()), job.key)
    for _ in range(job.count):
        scene = names[int(rng.choice(len(names), p=weights))]
        yield scene, renderer.draw_labels(job.tables[scene])


def _make_renderer(variant: str, scenes: Dict, classes: Sequence[str],
                   rng: np.random.Generator, img_size: int,
                   digit_size: Tuple[int, int], objects: Tuple[int, int],
                   noise_std: float, hue_jitter: Optional[float]
                   ) -> Tuple[SceneRenderer, Optional[float]]:
    """The variant's renderer.

    Args:
        variant (str): one of :data:`VARIANTS`.
        scenes (dict): the checked scene model (its ``styles`` give the
            many-class variant's hues).
        classes (Sequence[str]): the class names.
        rng (np.random.Generator): the random source.
        img_size (int): image side.
        digit_size (tuple[int, int]): min / max digit side.
        objects (tuple[int, int]): min / max objects per image.
        noise_std (float): pixel noise std (0-1 scale).
        hue_jitter (float, optional): many-class only: std of each
            object's hue around its style's; default the variant's.

    Returns:
        tuple: the renderer (:class:`SceneRenderer` or
        :class:`StyledSceneRenderer`) and the hue jitter it uses (None for
        ``digits``).
    """
    if variant == 'digits':
        return SceneRenderer(img_size, tuple(digit_size), objects,
                             noise_std, rng), hue_jitter
    hue_jitter = VARIANT_DEFAULTS[variant]['hue_jitter'] \
        if hue_jitter is None else float(hue_jitter)
    num_classes = len(classes)
    styles = list(scenes['styles'])
    renderer = StyledSceneRenderer(
        img_size, tuple(digit_size), objects, noise_std, rng,
        class_digits=[k % len(CLASSES) for k in range(num_classes)],
        class_hues=[
            float(scenes['styles'][styles[k // len(CLASSES)]])
            for k in range(num_classes)
        ],
        hue_jitter=hue_jitter)
    return renderer, hue_jitter


def _class_relations(
        variant: str, scenes: Dict, classes: Sequence[str]
) -> Tuple[List[List[int]], Optional[List[str]]]:
    """The look-alike class pairs and the COCO supercategories.

    Args:
        variant (str): one of :data:`VARIANTS`.
        scenes (dict): the checked scene model.
        classes (Sequence[str]): the class names.

    Returns:
        tuple: the look-alike pairs (class indices; many-class: the same
        digit in two look-alike styles) and the supercategory of each
        class (None for ``digits``: all ``digit``; many-class: the digit).
    """
    if variant == 'digits':
        return [list(p) for p in LOOKALIKES], None
    lookalikes = [[
        classes.index(f'{digit}_{a}'),
        classes.index(f'{digit}_{b}')
    ] for a, b in scenes.get('lookalikes', []) for digit in CLASSES]
    supercategories = [
        CLASSES[k % len(CLASSES)] for k in range(len(classes))
    ]
    return lookalikes, supercategories


def _render_splits(jobs: Sequence[SplitJob], renderer: SceneRenderer,
                   rng: np.random.Generator, writer: BenchmarkWriter,
                   progress: bool) -> None:
    """Render the images of every split, as :func:`sample_scenes` draws
    them, and hand each to the writer.

    Args:
        jobs (Sequence[SplitJob]): the splits, in drawing order.
        renderer (SceneRenderer): draws the images.
        rng (np.random.Generator): the random source (the renderer's).
        writer (BenchmarkWriter): saves the images and their records.
        progress (bool): show a progress bar.
    """
    with progress_bar(
            desc='rendering scenes',
            enabled=progress,
            total=sum(job.count for job in jobs),
            unit=' images',
            leave=True) as bar:
        for job in jobs:
            writer.start_split(job.key, job.folder)
            for scene, labels in sample_scenes(job, renderer, rng):
                pixels, boxes = renderer.render(labels, job.scans)
                writer.add_image(job.key, job.folder, scene, labels, pixels,
                                 boxes)
                bar.update(1)


def make_context_shift(out_dir: str,
                       seed: int = 0,
                       num_train: int = 2000,
                       num_val_per_site: int = 300,
                       img_size: int = 128,
                       digit_size: Tuple[int, int] = (14, 22),
                       objects: Optional[Tuple[int, int]] = None,
                       noise_std: float = 0.12,
                       scenes: Optional[Dict] = None,
                       overwrite: bool = False,
                       progress: bool = True,
                       variant: str = 'digits',
                       hue_jitter: Optional[float] = None,
                       before_commit: Optional[Callable[[str, Dict],
                                                        None]] = None
                       ) -> Dict:
    """Write the benchmark (images, COCO annotations, priors) to a folder.

    The folder is written under a temporary name (``<out_dir>.partial``)
    and renamed at the end: an interrupted run leaves no half-written
    benchmark, a failed one (e.g. a full disk) removes the temporary
    folder, and the next run removes one that a killed run left. Each
    image's scene
    type and classes are drawn by :func:`sample_scenes`, the image by the
    variant's renderer (:func:`_render_splits`), and the files are written
    by :class:`~.data_writer.BenchmarkWriter`.

    Args:
        out_dir (str): the folder to create.
        seed (int): the only source of randomness.
        num_train (int): train images.
        num_val_per_site (int): val images per deployment site.
        img_size (int): image side.
        digit_size (tuple[int, int]): min / max digit side.
        objects (tuple[int, int], optional): min / max objects per image;
            default (2, 6) for ``digits``, (2, 4) for ``many-class``.
        noise_std (float): pixel noise std (0-1 scale).
        scenes (dict, optional): the scene model; default the variant's
            (:data:`DEFAULT_SCENES`, :data:`MANY_CLASS_SCENES`).
        overwrite (bool): replace an existing folder.
        progress (bool): show a progress bar.
        variant (str): ``digits`` (default) or ``many-class``.
        hue_jitter (float, optional): many-class only: std of each
            object's hue around its style's, in degrees (default 8; the
            look-alike styles are 12 degrees apart).
        before_commit (callable, optional): ``before_commit(folder,
            meta)`` after everything is written to the temporary
            ``folder``, before ``meta`` goes to its ``meta.json`` and the
            folder is renamed into place (it may change both, e.g.
            :func:`~.simulated_sites.make_validation_data`).

    Returns:
        dict: the metadata written to ``meta.json`` (knobs, counts, the
        per-image class statistics of every split and the epsilon of
        every site's prior against E_t).

    Raises:
        ValueError: ``out_dir`` exists without ``overwrite``, or bad
            knobs.
        OSError: the folder cannot be written (a full disk in one line
            naming it); nothing is left behind.
    """
    defaults = VARIANT_DEFAULTS[_check_variant(variant)]
    scenes = check_scene_model(
        copy.deepcopy(scenes or defaults['scenes']), variant)
    objects = tuple(objects or defaults['objects'])
    classes = variant_classes(variant, scenes)
    if variant == 'digits' and hue_jitter is not None:
        raise ValueError('hue_jitter (--hue-jitter) belongs to the many-class '
                         'variant (--variant many-class)')
    tables, site_tables = _scene_tables(scenes, classes, objects, variant)
    writer = BenchmarkWriter(out_dir, classes, img_size, overwrite)
    try:
        return _write_benchmark(writer, variant, scenes, classes, tables,
                                site_tables, seed, num_train,
                                num_val_per_site, img_size, digit_size,
                                objects, noise_std, hue_jitter, progress,
                                before_commit)
    except OSError as exc:
        writer.abort()
        raise disk_full_error(exc, writer.out_dir) from None
    except BaseException:
        writer.abort()
        raise


def _write_benchmark(writer: BenchmarkWriter, variant: str, scenes: Dict,
                     classes: Sequence[str], tables: Dict[str, np.ndarray],
                     site_tables: Dict[str, Dict[str, np.ndarray]],
                     seed: int, num_train: int, num_val_per_site: int,
                     img_size: int, digit_size: Tuple[int, int],
                     objects: Tuple[int, int], noise_std: float,
                     hue_jitter: Optional[float], progress: bool,
                     before_commit: Optional[Callable[[str, Dict], None]]
                     ) -> Dict:
    """Draw, render and write the benchmark through ``writer`` and commit
    it: the body of :func:`make_context_shift` (its arguments, checked).

    Returns:
        dict: the metadata written to ``meta.json``.
    """
    num_classes = len(classes)
    rng = np.random.default_rng(seed)
    train_scans, val_scans = load_digits_split(seed=seed)
    renderer, hue_jitter = _make_renderer(variant, scenes, classes, rng,
                                          img_size, digit_size, objects,
                                          noise_std, hue_jitter)
    lookalikes, supercategories = _class_relations(variant, scenes, classes)
    jobs = _split_jobs(scenes, tables, site_tables, train_scans, val_scans,
                       num_train, num_val_per_site)
    _render_splits(jobs, renderer, rng, writer, progress)
    e_t = writer.write_train_prior(num_train)
    meta = dict(
        seed=seed, num_train=num_train, num_val_per_site=num_val_per_site,
        img_size=img_size, digit_size=list(digit_size),
        objects=list(objects), noise_std=noise_std, scenes=scenes,
        classes=list(classes), lookalikes=lookalikes, epsilon={},
        variant=variant, num_classes=num_classes,
        statistics=dict(train=label_statistics(
            writer.splits['train']['labels'], num_classes)))
    if variant == 'many-class':
        meta['hue_jitter'] = hue_jitter
    writer.write_splits(meta, e_t, supercategories)
    if before_commit is not None:
        before_commit(writer.tmp, meta)
    writer.commit(meta)
    return meta
