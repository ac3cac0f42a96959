# Copyright (c) mmcalidet contributors. All rights reserved.
"""Filter an Objects365 annotation file to the 80 COCO classes (the
paper's supplementary, "Objects365 Evaluation"), for evaluating a COCO
model on Objects365 without any change::

    python tools/dataset_converters/o365_to_coco.py \
        zhiyuan_objv2_val.json o365_val_coco.json

Objects365 categories map to COCO classes by case-insensitive name
matching plus the supplementary's manual table (bird <- Wild Bird /
Pigeon / Parrot, sports ball <- ten ball classes, dining table <- "Dinning
Table", ...), kept in ``mmcalidet/data/o365_to_coco_map.json``.
Annotations of other categories are dropped, then images left with no
annotation; category ids become COCO's (1..90, with COCO's names). Image
and annotation ids are kept. The counts kept are printed and written to
``<out>.report.json`` (the paper: 71,316 of 80,000 images, 438,215 of
1,240,587 annotations).
"""
import argparse
import json
import os
import os.path as osp
from collections import Counter
from typing import Dict, List, Optional, Tuple

# no model here: skip importing torch/mmdet (see mmcalidet/__init__.py)
os.environ.setdefault('MMCALIDET_LIGHT', '1')

from mmcalidet.utils.cli import run_tool
from mmcalidet.utils.file_io import atomic_write, load_json

#: the shipped mapping table
DEFAULT_MAP = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'mmcalidet',
    'data', 'o365_to_coco_map.json')
#: Objects365 val annotation files are ~500 MB
MAX_ANNOTATION_BYTES = 8 * 1024**3


def default_map_path() -> str:
    """The mapping file shipped in the installed package (or the source
    tree)."""
    try:
        import mmcalidet
        path = osp.join(
            osp.dirname(mmcalidet.__file__), 'data', 'o365_to_coco_map.json')
        if osp.isfile(path):
            return path
    except ImportError:  # pragma: no cover
        pass
    return DEFAULT_MAP


def _key(name: str) -> str:
    return ' '.join(str(name).split()).lower()


def load_mapping(path: str) -> Tuple[List[dict], Dict[str, List[str]]]:
    """Read the mapping file.

    Returns:
        tuple: COCO categories (``id``, ``name``, ``supercategory``) and
        the manual table (COCO name -> Objects365 names).
    """
    data = load_json(path, 'mapping file')
    cats = data.get('coco_categories')
    manual = data.get('manual', {})
    if not isinstance(cats, list) or not cats or not isinstance(manual, dict):
        raise ValueError(f'{path}: needs "coco_categories" (list) and '
                         '"manual" (object)')
    names = {_key(c['name']) for c in cats}
    unknown = [n for n in manual if _key(n) not in names]
    if unknown:
        raise ValueError(f'{path}: manual entry {unknown[0]!r} is not a '
                         'COCO class')
    return cats, manual


def build_category_map(
        o365_categories: List[dict], coco_categories: List[dict],
        manual: Dict[str,
                     List[str]]) -> Tuple[Dict[int, int], Dict[str, list]]:
    """Objects365 category id -> COCO category id.

    Args:
        o365_categories (list[dict]): the Objects365 ``categories``.
        coco_categories (list[dict]): COCO categories (id, name).
        manual (dict): COCO name -> Objects365 names.

    Returns:
        tuple: the id map and ``info`` with ``unmatched_coco`` (COCO
        classes without any Objects365 category) and ``missing_manual``
        (manual Objects365 names absent from the file).
    """
    by_name: Dict[str, List[dict]] = {}
    for cat in o365_categories:
        by_name.setdefault(_key(cat['name']), []).append(cat)
    manual_keys = {_key(k): v for k, v in manual.items()}
    mapping: Dict[int, int] = {}
    unmatched, missing = [], []
    for coco in coco_categories:
        wanted = manual_keys.get(_key(coco['name']), [coco['name']])
        found = False
        for name in wanted:
            cats = by_name.get(_key(name), [])
            if not cats and _key(coco['name']) in manual_keys:
                missing.append(name)
            for cat in cats:
                if cat['id'] in mapping and \
                        mapping[cat['id']] != coco['id']:
                    raise ValueError(f'Objects365 category {cat["name"]!r} '
                                     'maps to two COCO classes')
                mapping[cat['id']] = coco['id']
                found = True
        if not found:
            unmatched.append(coco['name'])
    return mapping, dict(unmatched_coco=unmatched, missing_manual=missing)


def convert(data: dict, coco_categories: List[dict],
            manual: Dict[str, List[str]]) -> Tuple[dict, dict]:
    """Filter an Objects365 annotation dict to COCO classes.

    Args:
        data (dict): the Objects365 annotation file's content.
        coco_categories (list[dict]): COCO categories.
        manual (dict): the manual table.

    Returns:
        tuple[dict, dict]: the COCO-format annotation dict and a report of
        the counts.
    """
    for key in ('images', 'annotations', 'categories'):
        if not isinstance(data.get(key), list):
            raise ValueError(f'not an Objects365/COCO annotation file: no '
                             f'"{key}" list')
    mapping, info = build_category_map(data['categories'], coco_categories,
                                       manual)
    anns = []
    per_class: Counter = Counter()
    for ann in data['annotations']:
        coco_id = mapping.get(ann.get('category_id'))
        if coco_id is None:
            continue
        ann = dict(ann, category_id=coco_id)
        anns.append(ann)
        per_class[coco_id] += 1
    keep = {ann['image_id'] for ann in anns}
    images = [img for img in data['images'] if img['id'] in keep]
    known = {img['id'] for img in data['images']}
    orphans = keep - known
    if orphans:
        raise ValueError(f'annotations refer to unknown image id '
                         f'{sorted(orphans)[0]}')
    out = {
        k: v
        for k, v in data.items()
        if k not in ('images', 'annotations', 'categories')
    }
    out.update(
        images=images,
        annotations=anns,
        categories=[dict(c) for c in coco_categories])
    names = {c['id']: c['name'] for c in coco_categories}
    n_img, n_ann = len(data['images']), len(data['annotations'])
    report = dict(
        images_total=n_img,
        images_kept=len(images),
        images_kept_pct=100.0 * len(images) / n_img if n_img else 0.0,
        annotations_total=n_ann,
        annotations_kept=len(anns),
        annotations_kept_pct=100.0 * len(anns) / n_ann if n_ann else 0.0,
        o365_categories_mapped=len(mapping),
        coco_classes_matched=len(coco_categories) -
        len(info['unmatched_coco']),
        **info,
        annotations_per_class={
            names[c]: per_class.get(c, 0)
            for c in sorted(names)
        })
    return out, report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Filter Objects365 annotations to the COCO classes')
    parser.add_argument('src', help='Objects365 annotation JSON')
    parser.add_argument('out', help='COCO-format annotation JSON to write')
    parser.add_argument(
        '--map',
        default=None,
        help='mapping file (default mmcalidet/data/o365_to_coco_map.json)')
    parser.add_argument(
        '--report', help='counts JSON (default <out>.report.json)')
    return parser.parse_args(argv)


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    coco_categories, manual = load_mapping(args.map or default_map_path())
    data = load_json(args.src, 'annotation file', MAX_ANNOTATION_BYTES)
    if not isinstance(data, dict):
        raise ValueError(f'{args.src}: not a COCO-style annotation file')
    out, report = convert(data, coco_categories, manual)
    report['source'] = args.src
    with atomic_write(args.out, 'w', encoding='utf-8') as f:
        json.dump(out, f)
    report_path = args.report or osp.splitext(args.out)[0] + '.report.json'
    with atomic_write(report_path, 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    print(f'images: {report["images_kept"]:,} of {report["images_total"]:,}'
          f' kept ({report["images_kept_pct"]:.1f}%)')
    print(f'annotations: {report["annotations_kept"]:,} of '
          f'{report["annotations_total"]:,} kept '
          f'({report["annotations_kept_pct"]:.1f}%)')
    print(f'COCO classes matched: {report["coco_classes_matched"]} of '
          f'{len(coco_categories)}')
    if report['unmatched_coco']:
        print('COCO classes without an Objects365 category: ' +
              ', '.join(report['unmatched_coco']))
    if report['missing_manual']:
        print('manual-table names not in the file: ' +
              ', '.join(report['missing_manual']))
    print(f'wrote {args.out}, {report_path}')
    return 0


if __name__ == '__main__':
    run_tool(main)
