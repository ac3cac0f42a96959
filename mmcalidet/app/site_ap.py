# Copyright (c) mmcalidet contributors. All rights reserved.
"""A site's AP under E_t and under a prior, from its labelled images.

The site is a COCO annotation file (its images beside it, in ``images/``
beside it or in ``../images/``), or a folder holding one such file, or a
folder of YOLO labels (``labels/*.txt`` or ``*.txt`` beside the images,
class indices in the model's order). The metrics are the library's
(:class:`~mmcalidet.evaluation.CocoEvaluator`, COCOeval's set-up): the
overall AP over the model's classes, and each class's AP on its own.
"""
import glob
import os.path as osp
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: the most site images evaluated by default (each runs twice)
MAX_SITE_IMAGES = 500


def _image_root(ann_file: str, file_name: str) -> str:
    """The folder an annotation file's images lie in."""
    here = osp.dirname(osp.abspath(ann_file))
    for root in (here, osp.join(here, 'images'),
                 osp.join(osp.dirname(here), 'images')):
        if osp.isfile(osp.join(root, file_name)):
            return root
    raise ValueError(f'{ann_file}: image {file_name!r} not found beside it, '
                     'in images/ beside it or in ../images/')


def _coco_from_yolo(folder: str, classes: Sequence[str]) -> Tuple[dict, str]:
    from ..datasets.yolo_to_coco import image_sizes_from_folder, yolo_to_coco
    img_dir = osp.join(folder, 'images')
    img_dir = img_dir if osp.isdir(img_dir) else folder
    label_dir = osp.join(folder, 'labels')
    label_dir = label_dir if osp.isdir(label_dir) else folder
    categories = [
        dict(id=k + 1, name=c, supercategory=c) for k, c in enumerate(classes)
    ]
    sizes = image_sizes_from_folder(img_dir)
    return yolo_to_coco(label_dir, sizes, categories), img_dir


def load_site(path: str, classes: Sequence[str]):
    """The site's labelled images.

    Args:
        path (str): a COCO annotation file, a folder with one, or a folder
            of YOLO labels (see the module).
        classes (Sequence[str]): the model's classes (YOLO labels index
            them).

    Returns:
        tuple: ``(coco, image_root)``: a loaded ``COCO`` and the folder of
        its ``file_name`` paths.

    Raises:
        ValueError: one line naming the problem (no such path, no
            annotation file, a file that is not JSON, no images).
    """
    import contextlib
    import io

    from mmdet.datasets.api_wrappers import COCO

    from ..priors.checks import _loose_name
    from ..utils.file_io import load_json
    path = (path or '').strip()
    if not path:
        raise ValueError('no site given: a COCO annotation file, or a folder '
                         'of labelled images')
    if not osp.exists(path):
        raise ValueError(f'site not found: {path}')
    root = None
    if osp.isdir(path):
        found = sorted(
            glob.glob(osp.join(path, '*.json')) +
            glob.glob(osp.join(path, 'annotations', '*.json')))
        if len(found) > 1:
            raise ValueError(f'{path}: {len(found)} JSON files; give the '
                             'annotation file itself')
        if found:
            path = found[0]
        else:
            data, root = _coco_from_yolo(path, classes)
    if root is None:
        data = load_json(path, 'site annotation file')
        if not isinstance(data, dict) or 'images' not in data:
            raise ValueError(f'{path}: not a COCO annotation file (no '
                             '"images")')
        if not data['images']:
            raise ValueError(f'{path}: holds no images')
        root = _image_root(path, data['images'][0]['file_name'])
    # the model's classes the file does not list (a site's file may list
    # only its own) are added: categories without ground truth, which COCOeval
    # leaves out of every mean
    # names matched as priors are (up to case and '_' vs ' ')
    spelled = {_loose_name(c): c for c in classes}
    cats = [
        dict(
            c,
            name=spelled.get(_loose_name(str(c.get('name'))), c.get('name')))
        for c in data.get('categories') or []
    ]
    listed = {c.get('name') for c in cats}
    next_id = max([int(c['id']) for c in cats] + [0]) + 1
    for name in classes:
        if name not in listed:
            cats.append(dict(id=next_id, name=name, supercategory=name))
            next_id += 1
    coco = COCO()
    coco.dataset = dict(data, categories=cats)
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    if not coco.get_img_ids():
        raise ValueError(f'{path}: holds no images')
    return coco, root


def per_class_ap(coco, classes: Sequence[str], img_ids: Sequence[int],
                 results: Sequence) -> Tuple[float, Dict[str, float]]:
    """The overall AP and each class's AP (COCOeval's, the library's
    :class:`~mmcalidet.evaluation.CocoEvaluator`).

    Args:
        coco: the site's ``COCO``.
        classes (Sequence[str]): the model's classes.
        img_ids (Sequence[int]): the image of each result.
        results (Sequence[InstanceData]): the detections.

    Returns:
        tuple: the AP (a fraction) and ``{class: AP}`` for the classes with
        ground truth on the site.
    """
    from mmengine.structures import InstanceData

    from ..evaluation.coco import CocoEvaluator
    overall = CocoEvaluator(coco, classes).evaluate_ap(img_ids, results)
    with_gt = {ann['category_id'] for ann in coco.dataset['annotations']}
    per_class = {}
    for k, name in enumerate(classes):
        ids = coco.get_cat_ids(cat_names=[name])
        if not ids or ids[0] not in with_gt:
            continue
        alone = []
        for res in results:
            keep = res.labels == k
            alone.append(
                InstanceData(
                    bboxes=res.bboxes[keep],
                    scores=res.scores[keep],
                    labels=res.labels[keep] * 0))
        per_class[name] = CocoEvaluator(coco,
                                        [name]).evaluate_ap(img_ids, alone)
    return overall, per_class


def site_ap(session,
            path: str,
            prior,
            max_images: int = MAX_SITE_IMAGES,
            progress: Optional[Callable[[float, str], None]] = None) -> Dict:
    """The site's AP under E_t and under ``prior``.

    Args:
        session (PriorSession): the detector.
        path (str): the site (see :func:`load_site`).
        prior (Prior): the prior to compare with E_t.
        max_images (int): evaluate at most this many images (the first).
        progress (callable, optional): ``progress(fraction, text)``.

    Returns:
        dict: ``num_images``, ``skipped`` (images that could not be read),
        ``prior`` (its name), ``ap_train`` and ``ap_prior`` (the overall
        AP under E_t and under the prior, fractions) and ``per_class``
        ({class: (AP under E_t, AP under the prior)}).
    """
    coco, root = load_site(path, session.classes)
    ids = sorted(coco.get_img_ids())[:max_images]
    files, img_ids, skipped = [], [], []
    for img_id in ids:
        file = osp.join(root, coco.imgs[img_id]['file_name'])
        try:
            files.append(session.check_image(file))
            img_ids.append(img_id)
        except ValueError as exc:
            skipped.append(str(exc))
    if not files:
        raise ValueError(f'none of the {len(ids)} site images could be read '
                         f'({skipped[0] if skipped else "no images"})')
    priors = [session.train_prior, prior]
    total = 2 * len(files)
    results: List[list] = []
    for run, p in enumerate(priors):

        def step(done, run=run, p=p):
            if progress is not None:
                progress((run * len(files) + done) / total,
                         f'detecting under {p.name}: {done}/{len(files)}')

        preds = session.detect(files, p, progress=step)
        results.append([pred.pred_instances for pred in preds])
    if progress is not None:
        progress(1.0, 'evaluating')
    (ap_t, cls_t), (ap_p, cls_p) = (
        per_class_ap(coco, session.classes, img_ids, r) for r in results)
    return dict(
        num_images=len(files),
        skipped=skipped,
        prior=prior.name,
        ap_train=ap_t,
        ap_prior=ap_p,
        per_class={c: (cls_t[c], cls_p[c])
                   for c in cls_t})


def ap_figure(report: Dict):
    """A bar chart of each class's AP under the prior minus under E_t, the
    overall AP of each in the title.

    Args:
        report (dict): :func:`site_ap`'s result.

    Returns:
        matplotlib.figure.Figure: the chart.
    """
    from matplotlib.figure import Figure
    prior_name = report['prior']
    names = list(report['per_class'])
    diffs = np.array([100 * (p - t) for t, p in report['per_class'].values()])
    fig = Figure(figsize=(max(5.0, 0.28 * len(names) + 2), 3.6), dpi=90)
    ax = fig.add_subplot(1, 1, 1)
    colors = ['#2b8cbe' if d >= 0 else '#e34a33' for d in diffs]
    ax.bar(range(len(names)), diffs, color=colors)
    ax.axhline(0, color='black', linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_ylabel(f'AP({prior_name}) - AP(E_t)')
    ax.set_title(
        f'{report["num_images"]} site images: AP under E_t '
        f'{100 * report["ap_train"]:.1f}, under {prior_name} '
        f'{100 * report["ap_prior"]:.1f}',
        fontsize=9)
    fig.tight_layout()
    return fig


def ap_rows(report: Dict) -> List[List]:
    """The per-class table: class, AP under E_t, under the prior, change
    (AP points)."""
    return [[c,
             round(100 * t, 2),
             round(100 * p, 2),
             round(100 * (p - t), 2)]
            for c, (t, p) in report['per_class'].items()]


def default_sites(data_root: Optional[str]) -> List[str]:
    """The demo's val site annotation files under a data folder
    (``annotations/instances_val_<site>.json``), if any."""
    if not data_root:
        return []
    return sorted(
        glob.glob(osp.join(data_root, 'annotations', 'instances_val_*.json')))
