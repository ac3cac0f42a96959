# Copyright (c) mmcalidet contributors. All rights reserved.
"""The cross-fitting of :func:`~mmcalidet.calibration.fit_site_prior`:
the site's labels and what of its annotations a fit can use, each labelled
image's detections under every candidate prior estimated from the other
folds, each candidate's AP gain over E_t, and the support a candidate is
scored with (for a CaliFormer that reads one).
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..evaluation.coco import CocoEvaluator
from ..evaluation.scoring import Rescorer
from ..models.layers.support_ops import label_support
from ..priors.shrinkage import shrink, site_estimate


def register_site_support(rescorer: Rescorer, train_prior: np.ndarray,
                          prior: np.ndarray,
                          label_lists: Sequence[Sequence[int]],
                          alpha: float) -> None:
    """Give ``shrink(E_t, E_site, alpha)`` of some labelled images its
    support, for a CaliFormer that reads one (experimental): n = the
    images, and the class shares moved with the prior, ``p_t + alpha
    (p_site - p_t)`` clipped to [0, 1], as
    :func:`~mmcalidet.evaluation.prior_support.register_label_supports`
    gives the sweep's priors. Nothing happens unless E_t has a registered
    support (``rescorer.support_of(train_prior)``).

    Args:
        rescorer (Rescorer): the scorer the prior is scored by.
        train_prior (np.ndarray): E_t.
        prior (np.ndarray): the shrunk prior.
        label_lists (Sequence): the labelled images' class indices.
        alpha (float): its shrinkage (1: the images' own statistics).
    """
    # (a scorer without supports, e.g. a stand-in, has no support_of)
    support_of = getattr(rescorer, 'support_of', None)
    train = None if support_of is None else support_of(train_prior)
    if train is None:
        return
    n, share = label_support(label_lists, len(train_prior))
    rescorer.register_support(
        prior, n, np.clip(train[1] + alpha * (share - train[1]), 0.0, 1.0))


def site_annotation_counts(
        evaluator: CocoEvaluator, img_ids: Sequence,
        label_lists: Sequence[Sequence[int]]) -> Dict[str, int]:
    """What a site's annotation file holds for some images and what of
    it a fit can use.

    Args:
        evaluator (CocoEvaluator): the site's annotations (``coco``) and
            the model's categories (``cat_ids``).
        img_ids (Sequence): the images' COCO ids.
        label_lists (Sequence[Sequence[int]]): their ground-truth labels
            as the cache holds them (those of the model's classes).

    Returns:
        dict: ``annotations`` (all, of any class), ``used`` (the labels
        the fit reads), ``unknown_class`` (annotations of a category the
        model does not have) and ``images_without_labels``.
    """
    known = set(getattr(evaluator, 'cat_ids', ()) or ())
    coco = getattr(evaluator, 'coco', None)
    total = unknown = 0
    if coco is not None and known:
        for img_id in img_ids:
            for ann in coco.imgToAnns.get(img_id, ()):
                total += 1
                unknown += ann.get('category_id') not in known
    used = int(sum(len(labels) for labels in label_lists))
    return dict(
        annotations=max(total, used),
        used=used,
        unknown_class=int(unknown),
        images_without_labels=int(
            sum(len(labels) == 0 for labels in label_lists)))


def site_labels(evaluator: CocoEvaluator, cache,
                indices: List[int]) -> Tuple[List, List, Dict]:
    """The labels and image ids of a site's images, and what of their
    annotations the model's classes leave out (logged).

    Args:
        evaluator (CocoEvaluator): the site's annotations.
        cache: the decoder cache of the site's images.
        indices (list[int]): the labelled images' positions in the cache.

    Returns:
        tuple: the label lists, the image ids and the counts dropped
        (``unknown_class``, ``images_without_labels``, where not 0).
    """
    n = len(indices)
    all_labels, all_ids = cache.gt_label_lists(), cache.img_ids()
    labels = [all_labels[i] for i in indices]
    img_ids = [all_ids[i] for i in indices]
    counts = site_annotation_counts(evaluator, img_ids, labels)
    if counts['used'] == 0:
        raise ValueError(
            f'the {n} site images hold no annotation of the model\'s '
            f'classes to fit a prior on ({counts["annotations"]} '
            f'annotations found, {counts["unknown_class"]} of classes the '
            'model does not have)')
    dropped = {
        key: counts[key]
        for key in ('unknown_class', 'images_without_labels') if counts[key]
    }
    if counts['unknown_class']:
        from mmengine.logging import print_log
        print_log(
            f'fit_site_prior: {counts["unknown_class"]} of '
            f'{counts["annotations"]} site annotations are of classes the '
            'model does not have and are left out; '
            f'{counts["images_without_labels"]} of {n} images hold none of '
            'its classes',
            logger='current',
            level=30)
    return labels, img_ids, dropped


def cross_fitted_predictions(rescorer: Rescorer, train_prior: np.ndarray,
                             labels: List, indices: List[int],
                             parts: List[np.ndarray], absent: Sequence[str],
                             alphas: Sequence[float]) -> Dict:
    """Each image's detections under each candidate prior estimated from
    the other folds' labels.

    Args:
        rescorer (Rescorer): scores the site's cached images under a prior.
        train_prior (np.ndarray): E_t.
        labels (list): the site images' label lists.
        indices (list[int]): their positions in the cache.
        parts (list[np.ndarray]): the folds (positions in ``labels``).
        absent (Sequence[str]): the estimate's forms.
        alphas (Sequence[float]): the shrinkage strengths.

    Returns:
        dict: (form, alpha) -> one detection list per image.
    """
    n = len(labels)
    candidates = [(form, float(a)) for form in absent for a in alphas]
    # cross-fitted predictions: image -> candidate -> detections
    predictions = {c: [None] * n for c in candidates}
    for part in parts:
        held_out = set(part.tolist())
        rest = [labels[i] for i in range(n) if i not in held_out]
        fold_indices = [indices[i] for i in part]
        estimates = {}
        for form in absent:
            estimate = site_estimate(rest, train_prior, form)
            # where the other folds show every class, the forms agree:
            # their candidates' predictions are the same, scored once
            same = next(
                (f
                 for f, e in estimates.items() if np.array_equal(e, estimate)),
                None)
            estimates[form] = estimate
            for alpha in alphas:
                if same is not None:
                    preds = [
                        predictions[(same, float(alpha))][i] for i in part
                    ]
                else:
                    candidate = shrink(train_prior, estimate, alpha)
                    register_site_support(rescorer, train_prior, candidate,
                                          rest, alpha)
                    preds = rescorer.predict(candidate, fold_indices)
                for i, pred in zip(part, preds):
                    predictions[(form, float(alpha))][i] = pred
    return predictions


def candidate_gains(evaluator: CocoEvaluator, img_ids: List, predictions: Dict,
                    candidates: List[Tuple], base) -> Tuple[Dict, List[Dict]]:
    """Each candidate's per-image matches and its AP gain over E_t.

    Args:
        evaluator (CocoEvaluator): the site's annotations.
        img_ids (list): the site images' ids.
        predictions (dict): :func:`cross_fitted_predictions`'s.
        candidates (list[tuple]): the (form, alpha) pairs, in order.
        base: E_t's per-image matches.

    Returns:
        tuple: the matches by candidate and the table of gains.

    Raises:
        ValueError: a gain that is not finite.
    """
    base_ap = base.ap()
    matches, table = {}, []
    for cand in candidates:
        # a candidate with the same predictions as one before (the forms
        # agree in every fold) has its matches
        same = next((c for c in matches if all(
            a is b for a, b in zip(predictions[c], predictions[cand]))), None)
        matches[cand] = matches[same] if same is not None else \
            evaluator.image_matches(img_ids, predictions[cand])
        gain = 100 * (matches[cand].ap() - base_ap)
        if not np.isfinite(gain):
            raise ValueError(
                f'the AP gain of candidate {cand} is {gain}: the site\'s '
                'cached hidden states or annotations give no finite AP')
        table.append(dict(absent=cand[0], alpha=cand[1], gain=gain))
    return matches, table
