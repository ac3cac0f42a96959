# Copyright (c) mmcalidet contributors. All rights reserved.
"""Convert YOLO-format labels to a COCO-format annotation dict."""
import io
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from ..utils.file_io import MAX_LABEL_FILE_BYTES, load_json, read_small_file

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp')


def read_categories(path: str) -> List[Dict]:
    """COCO categories from a classes file.

    ``coco2017-labels/classes.json`` style (``index``, ``coco_id``,
    ``name``, ``supercategory``) keeps the real COCO ids; a plain list of
    names gets ids 1..K.

    Args:
        path (str): the classes file (.json or one name per line).

    Returns:
        list[dict]: ``{"id", "name", "supercategory"}`` by class index.
    """
    from ..priors.label_io import read_class_names
    names = read_class_names(path)
    entries = None
    if path.endswith('.json'):
        data = load_json(path, 'classes file')
        if isinstance(data, list) and data and isinstance(data[0], dict):
            entries = sorted(data, key=lambda d: d.get('index', 0))
    cats = []
    for k, name in enumerate(names):
        entry = entries[k] if entries else {}
        cats.append(
            dict(
                id=int(entry.get('coco_id', entry.get('id', k + 1))),
                name=name,
                supercategory=entry.get('supercategory', name)))
    ids = [c['id'] for c in cats]
    if len(set(ids)) != len(ids):
        raise ValueError(f'classes file {path}: duplicated category ids')
    return cats


def image_sizes_from_folder(image_dir: str) -> Dict[str, List[int]]:
    """Read ``{file name: [width, height]}`` from the image headers.

    Args:
        image_dir (str): folder of images.

    Returns:
        dict: sizes by file name.

    Raises:
        ValueError: naming a file that is not a readable image.
    """
    from PIL import Image, UnidentifiedImageError
    sizes = {}
    for name in sorted(os.listdir(image_dir)):
        if not name.lower().endswith(IMAGE_EXTENSIONS):
            continue
        path = osp.join(image_dir, name)
        try:
            with Image.open(path) as img:
                img.verify()
            with Image.open(path) as img:
                sizes[name] = list(img.size)
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise ValueError(f'corrupt or unreadable image {path}: {exc}') \
                from exc
    if not sizes:
        raise ValueError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) in '
                         f'{image_dir}')
    return sizes


def read_sizes_json(path: str) -> Dict[str, List[int]]:
    """Read a ``{file name: [width, height]}`` JSON file."""
    sizes = load_json(path, 'sizes file')
    if not isinstance(sizes, dict) or not sizes:
        raise ValueError(f'sizes file {path} must be a non-empty object '
                         '{"file name": [width, height]}')
    for name, wh in sizes.items():
        if not (isinstance(wh, list) and len(wh) == 2
                and all(isinstance(v, int) and v > 0 for v in wh)):
            raise ValueError(f'sizes file {path}: {name!r} needs [width, '
                             f'height] as positive ints, got {wh!r}')
    return sizes


def _image_id(stem: str, fallback: int) -> int:
    return int(stem) if stem.isdigit() else fallback


def parse_yolo_boxes(path: str, num_classes: int) -> List[List[float]]:
    """Read ``class cx cy w h`` lines of one YOLO label file.

    Returns:
        list: ``[class, cx, cy, w, h]`` rows.

    Raises:
        ValueError: naming the file (and line): not a regular file, too
            large (``MAX_LABEL_FILE_BYTES``), not UTF-8, a bad line.
    """
    data = read_small_file(
        path, MAX_LABEL_FILE_BYTES, 'label file', allow_empty=True)
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as exc:
        raise ValueError(f'label file {path} is not UTF-8 text: {exc}') \
            from exc
    rows = []
    # universal newlines, as a text-mode open() reads them
    for line_no, line in enumerate(io.StringIO(text, newline=None), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            raise ValueError(f'{path}, line {line_no}: {len(fields)} '
                             'fields (expected 5: class cx cy w h)')
        if not fields[0].isdigit():
            raise ValueError(f'{path}, line {line_no}: class index '
                             f'{fields[0]!r} is not a non-negative '
                             'integer')
        cls = int(fields[0])
        if cls >= num_classes:
            raise ValueError(f'{path}, line {line_no}: class index '
                             f'{cls} is out of range for {num_classes} '
                             'classes')
        try:
            box = [float(v) for v in fields[1:]]
        except ValueError as exc:
            raise ValueError(f'{path}, line {line_no}: {exc}') from exc
        for name, text, value in zip(('cx', 'cy', 'w', 'h'), fields[1:],
                                     box):
            # NaN / Infinity would be written as invalid JSON
            if not math.isfinite(value):
                raise ValueError(f'{path}, line {line_no}: {name} is '
                                 f'{text!r}, not a finite number')
        if box[2] < 0 or box[3] < 0:
            raise ValueError(f'{path}, line {line_no}: negative box size '
                             f'(w {fields[3]}, h {fields[4]})')
        rows.append([cls] + box)
    return rows


def yolo_to_coco(label_dir: str,
                 sizes: Dict[str, List[int]],
                 categories: Sequence[Dict],
                 strict: bool = True) -> Dict:
    """Build a COCO annotation dict from YOLO label files.

    Every image in ``sizes`` becomes an image entry (images without a label
    file have no annotation, as in COCO). Boxes are converted from
    normalised centre format to pixels ``[x, y, w, h]``; ``area`` is the
    box area (COCO's own ``area`` is the mask area, so it differs).

    Args:
        label_dir (str): folder of ``<image stem>.txt`` files.
        sizes (dict): ``{image file name: [width, height]}``.
        categories (Sequence[dict]): COCO categories by class index.
        strict (bool): a label file without an image is an error.

    Returns:
        dict: ``{"images", "annotations", "categories"}``.
    """
    if not osp.isdir(label_dir):
        raise ValueError(f'label folder not found: {label_dir}')
    by_stem = {osp.splitext(name)[0]: name for name in sizes}
    label_files = sorted(
        f for f in os.listdir(label_dir)
        if f.endswith('.txt') and f != 'classes.txt')
    orphans = [f for f in label_files if f[:-4] not in by_stem]
    if orphans and strict:
        raise ValueError(f'{len(orphans)} label files have no image, e.g. '
                         f'{osp.join(label_dir, orphans[0])}')
    images, annotations = [], []
    used_ids = set()
    for k, name in enumerate(sorted(sizes)):
        stem = osp.splitext(name)[0]
        img_id = _image_id(stem, k + 1)
        if img_id in used_ids:
            raise ValueError(f'duplicated image id {img_id} ({name})')
        used_ids.add(img_id)
        width, height = sizes[name]
        images.append(
            dict(id=img_id, file_name=name, width=width, height=height))
        label_path = osp.join(label_dir, stem + '.txt')
        if not osp.exists(label_path):
            continue
        for cls, cx, cy, w, h in parse_yolo_boxes(label_path, len(categories)):
            bw, bh = w * width, h * height
            x, y = cx * width - bw / 2, cy * height - bh / 2
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=img_id,
                    category_id=categories[cls]['id'],
                    bbox=[
                        round(x, 2),
                        round(y, 2),
                        round(bw, 2),
                        round(bh, 2)
                    ],
                    area=round(bw * bh, 2),
                    iscrowd=0))
    return dict(
        images=images,
        annotations=annotations,
        categories=[dict(c) for c in categories])


def label_stems(label_dir: str) -> List[str]:
    """The image stems of a folder's YOLO label files (sorted)."""
    if not osp.isdir(label_dir):
        raise ValueError(f'label folder not found: {label_dir}')
    return sorted(f[:-4] for f in os.listdir(label_dir)
                  if f.endswith('.txt') and f != 'classes.txt')


def labelled_sizes(sizes: Dict[str, List[int]],
                   label_dir: str) -> Dict[str, List[int]]:
    """Keep the images of ``sizes`` that have a label file in
    ``label_dir`` (a sizes file may list a whole split, the labels a
    subset).

    Args:
        sizes (dict): ``{image file name: [width, height]}``.
        label_dir (str): folder of ``<image stem>.txt`` files.

    Returns:
        dict: the sizes of the labelled images.

    Raises:
        ValueError: when no image of ``sizes`` has a label file.
    """
    stems = set(label_stems(label_dir))
    kept = {
        name: wh
        for name, wh in sizes.items() if osp.splitext(name)[0] in stems
    }
    if not kept:
        raise ValueError(f'no image of the sizes file has a label file in '
                         f'{label_dir}')
    return kept


def select_sizes(sizes: Dict[str, List[int]],
                 names: Optional[Sequence[str]]) -> Dict[str, List[int]]:
    """Keep only the listed image file names (all when ``names`` is None)."""
    if names is None:
        return sizes
    missing = [n for n in names if n not in sizes]
    if missing:
        raise ValueError(f'no size known for image {missing[0]!r}')
    return {n: sizes[n] for n in names}
