# Copyright (c) mmcalidet contributors. All rights reserved.
"""A site's prior fitted from a few labelled images, so that injecting it
cannot be expected to hurt: the site's statistics shrunk toward E_t by
as much as cross-validation on those images supports.

From n labelled site images (8 to 128), :func:`fit_site_prior`

1. splits them into folds; for each fold, estimates E_site from the other
   folds' labels and re-scores the fold's cached decoder outputs (the
   head's cost) under each candidate ``E_t + alpha (E_site - E_t)``, so
   that every image is scored by a prior that did not see it;
2. takes the candidate whose cross-fitted AP gain over E_t on the n
   images is largest, if the low end of that gain's paired bootstrap 95 %
   interval over the images is above 0; otherwise E_t itself
   (``alpha = 0``): the prior leaves E_t only where the n images show a
   gain beyond resampling noise (``accept='gain'``: wherever the gain is
   positive);
3. gives the prior the chosen alpha on the estimate from all n images.

Candidates: ``alpha`` in :data:`ALPHAS` for two estimates of E_site that
differ only in the columns of classes the n images never show: E_t's
(``absent='train'``: nothing learned about them) or flat 0.5
(``absent='flat'``, :func:`~mmcalidet.priors.batch_prior`'s). The chosen
candidate is the best of several on the same images, so its
cross-validated gain is optimistic by a little; the interval rule keeps a
like-training site at E_t. It was chosen over ``accept='gain'`` on
simulated sites of the training data (projects/context_shift/README.md):
there ``gain`` moved off E_t on noise and lost on one site of four.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..models.layers.support_ops import label_support
from ..priors import Prior, batch_prior
from ..utils.progress import progress_bar
from ..utils.validation import check_finite_array, check_float, check_int
from .coco import CocoEvaluator, paired_bootstrap
from .scoring import Rescorer

#: the shrinkage candidates (0 is E_t, the fallback)
ALPHAS = (0.25, 0.5, 0.75, 1.0, 1.25)
#: the two estimates of a site's columns for classes its images never show
ABSENT = ('train', 'flat')
#: when a candidate replaces E_t (:func:`fit_site_prior`'s ``accept``)
ACCEPT = ('interval', 'gain')
#: the default: the low end of its gain's interval is above 0
DEFAULT_ACCEPT = 'interval'


def site_estimate(label_lists: Sequence[Sequence[int]],
                  train_prior: np.ndarray,
                  absent: str = 'train') -> np.ndarray:
    """E_site of labelled images.

    Args:
        label_lists (Sequence): the images' class indices.
        train_prior (np.ndarray): E_t, K x K.
        absent (str): the columns of classes no image shows: ``'train'``
            (E_t's) or ``'flat'`` (0.5, as ``batch_prior`` has them).

    Returns:
        np.ndarray: K x K float64.
    """
    if absent not in ABSENT:
        raise ValueError(f'absent must be one of {ABSENT}, got {absent!r}')
    num_classes = len(train_prior)
    estimate = batch_prior(num_classes, label_lists)
    if absent == 'train':
        seen = np.zeros(num_classes, dtype=bool)
        for labels in label_lists:
            seen[np.asarray(labels, dtype=np.int64)] = True
        estimate[:, ~seen] = np.asarray(train_prior)[:, ~seen]
    return estimate


def shrink(train_prior: np.ndarray, estimate: np.ndarray,
           alpha: float) -> np.ndarray:
    """``E_t + alpha (E_site - E_t)``, clipped to [0, 1], 1 on the
    diagonal.

    Args:
        train_prior (np.ndarray): E_t.
        estimate (np.ndarray): E_site.
        alpha (float): how far to move toward E_site (1: E_site itself).

    Returns:
        np.ndarray: K x K float64.
    """
    check_float('alpha', alpha)
    train_prior = np.asarray(train_prior, dtype=np.float64)
    prior = np.clip(train_prior + alpha * (estimate - train_prior), 0.0, 1.0)
    np.fill_diagonal(prior, 1.0)
    return prior


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


@dataclass
class SitePriorFit:
    """What :func:`fit_site_prior` chose, and why.

    Attributes:
        prior (np.ndarray): the fitted prior (E_t when ``alpha`` is 0).
        estimate (np.ndarray): E_site of all n images (the chosen form).
        alpha (float): the chosen shrinkage (0: E_t).
        absent (str): the chosen estimate form (:data:`ABSENT`).
        num_images (int): n.
        gain (float): the cross-fitted AP gain over E_t on the n images
            (AP points; 0 for E_t).
        low (float): its paired bootstrap interval's lower end.
        high (float): its upper end.
        folds (int): the folds.
        table (list[dict]): every candidate's ``absent``, ``alpha``,
            ``gain``.
        accept (str): the rule that took it (:data:`ACCEPT`).
        dropped (dict): what of the images' annotations the fit could not
            use (:func:`site_annotation_counts`): ``unknown_class``
            (annotations of classes the model does not have) and
            ``images_without_labels`` (images that count only as
            negatives), where not 0; also in the prior file.
        support (tuple, optional): the fitted prior's (support, class
            shares) as it was scored, for a support-aware CaliFormer
            (E_t's for alpha 0, :func:`register_site_support` otherwise);
            ``None``: none.
    """
    prior: np.ndarray
    estimate: np.ndarray
    alpha: float
    absent: str
    num_images: int
    gain: float
    low: float
    high: float
    folds: int
    table: List[Dict] = field(default_factory=list)
    accept: str = DEFAULT_ACCEPT
    dropped: Dict[str, int] = field(default_factory=dict)
    support: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def meta(self) -> Dict:
        """The keys a fitted prior file records besides the matrix, the
        class names and the support.

        Returns:
            dict: the keys.
        """
        return dict(
            source='fit_site_prior',
            num_images=self.num_images,
            alpha=self.alpha,
            absent=self.absent,
            folds=self.folds,
            accept=self.accept,
            cv_gain_ap=round(self.gain, 3),
            cv_gain_interval_95=[round(self.low, 3),
                                 round(self.high, 3)],
            dropped=dict(self.dropped))

    def to_prior(self, classes: Sequence[str], name: str = 'fit') -> Prior:
        """The fitted prior with the support it was scored with, so that
        loading its file gives a support-aware CaliFormer the same V' (the
        file records it as ``support_images`` and ``images_per_class``:
        its ``num_images`` counts the site images fitted on).

        Args:
            classes (Sequence[str]): the class names.
            name (str): how errors name it (its file).

        Returns:
            Prior: the fitted prior.
        """
        return Prior(
            self.prior,
            classes,
            *(self.support or (None, None)),
            meta=self.meta(),
            name=name)


def site_annotation_counts(evaluator: CocoEvaluator, img_ids: Sequence,
                           label_lists: Sequence[Sequence[int]]
                           ) -> Dict[str, int]:
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


def check_alphas(alphas: Sequence[float], positive: bool = True) -> None:
    """Refuse shrinkage candidates that are not finite numbers (> 0 with
    ``positive``: 0 is E_t, the fallback), naming ``alphas``."""
    try:
        values = [float(a) for a in alphas]
    except (TypeError, ValueError):
        values = []
    if not values or any(not np.isfinite(a) or (positive and a <= 0)
                         for a in values):
        bound = ' and > 0' if positive else ''
        raise ValueError(f'alphas must be finite{bound} numbers, got '
                         f'{alphas}')


def _site_labels(evaluator: CocoEvaluator, cache,
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


def _cross_fitted_predictions(rescorer: Rescorer, train_prior: np.ndarray,
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
            same = next((f for f, e in estimates.items()
                         if np.array_equal(e, estimate)), None)
            estimates[form] = estimate
            for alpha in alphas:
                if same is not None:
                    preds = [predictions[(same, float(alpha))][i]
                             for i in part]
                else:
                    candidate = shrink(train_prior, estimate, alpha)
                    register_site_support(rescorer, train_prior, candidate,
                                          rest, alpha)
                    preds = rescorer.predict(candidate, fold_indices)
                for i, pred in zip(part, preds):
                    predictions[(form, float(alpha))][i] = pred
    return predictions


def _candidate_gains(evaluator: CocoEvaluator, img_ids: List,
                     predictions: Dict, candidates: List[Tuple],
                     base) -> Tuple[Dict, List[Dict]]:
    """Each candidate's per-image matches and its AP gain over E_t.

    Args:
        evaluator (CocoEvaluator): the site's annotations.
        img_ids (list): the site images' ids.
        predictions (dict): :func:`_cross_fitted_predictions`'s.
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


def fit_site_prior(rescorer: Rescorer,
                   evaluator: CocoEvaluator,
                   train_prior: np.ndarray,
                   alphas: Sequence[float] = ALPHAS,
                   absent: Sequence[str] = ABSENT,
                   folds: int = 4,
                   resamples: int = 1000,
                   seed: int = 0,
                   indices: Optional[Sequence[int]] = None,
                   accept: str = DEFAULT_ACCEPT) -> SitePriorFit:
    """Fit a site's prior on its labelled images (the module's recipe).

    Args:
        rescorer (Rescorer): a CaliDet model (or a plain one with a
            post-hoc correction) on the cached decoder outputs of the
            site's labelled images.
        evaluator (CocoEvaluator): their annotations.
        train_prior (np.ndarray): E_t, the fallback and the shrinkage
            target.
        alphas (Sequence[float]): the shrinkage candidates (> 0).
        absent (Sequence[str]): the estimate forms tried.
        folds (int): cross-validation folds (at most n).
        resamples (int): bootstrap resamples of the gain's interval (0:
            no interval, ``nan``).
        seed (int): the folds' and the bootstrap's seed.
        indices (Sequence[int], optional): the cached images to use
            (default all).
        accept (str): when the best candidate replaces E_t:
            ``'interval'`` (the default), the low end of its
            cross-validated gain's paired bootstrap interval is above 0
            (needs ``resamples``); ``'gain'``, the gain itself is.

    Returns:
        SitePriorFit: the prior and its record.

    Raises:
        ValueError: fewer than 2 images, a bad candidate, or no
            annotation of the model's classes on the images (the number
            of those found is named). Annotations left out (classes the
            model does not have, images without one) are counted in
            ``dropped`` and logged.
    """
    check_alphas(alphas)
    cache = rescorer.cache
    indices = list(range(
        len(cache))) if indices is None else [int(i) for i in indices]
    n = len(indices)
    if n < 2:
        raise ValueError(f'a site prior needs at least 2 labelled images, '
                         f'got {n}')
    check_int('folds', folds, 2)
    check_int('resamples', resamples, 0)
    check_int('seed', seed, 0)
    if accept not in ACCEPT:
        raise ValueError(f'accept must be one of {ACCEPT}, got {accept!r}')
    if accept == 'interval' and not resamples:
        raise ValueError("accept='interval' needs resamples > 0")
    folds = max(2, min(int(folds), n))
    train_prior = np.asarray(train_prior, dtype=np.float64)
    labels, img_ids, dropped = _site_labels(evaluator, cache, indices)
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, folds)
    candidates = [(form, float(a)) for form in absent for a in alphas]
    predictions = _cross_fitted_predictions(rescorer, train_prior, labels,
                                            indices, parts, absent, alphas)
    base = evaluator.image_matches(img_ids,
                                   rescorer.predict(train_prior, indices))
    matches, table = _candidate_gains(evaluator, img_ids, predictions,
                                      candidates, base)
    best = max(table, key=lambda row: (row['gain'], -row['alpha']))
    interval = None  # the best candidate's, when it gains
    if best['gain'] > 0:
        interval = paired_bootstrap(
            matches[(best['absent'], best['alpha'])], base,
            resamples=resamples, seed=seed) \
            if resamples else dict(low=float('nan'), high=float('nan'))
    if interval is not None and (accept == 'gain' or interval['low'] > 0):
        form, alpha, gain = best['absent'], best['alpha'], best['gain']
    else:  # no candidate gains (beyond noise, for 'interval'): E_t
        form, alpha, gain = absent[0], 0.0, 0.0
        interval = dict(low=0.0, high=0.0)
    estimate = site_estimate(labels, train_prior, form)
    prior = shrink(train_prior, estimate, alpha) if alpha else \
        train_prior.copy()
    if alpha:
        register_site_support(rescorer, train_prior, prior, labels, alpha)
    support_of = getattr(rescorer, 'support_of', None)
    return SitePriorFit(
        prior=prior,
        estimate=estimate,
        alpha=alpha,
        absent=form,
        num_images=n,
        gain=gain,
        low=interval['low'],
        high=interval['high'],
        folds=folds,
        table=table,
        accept=accept,
        dropped=dropped,
        support=None if support_of is None else support_of(prior))


def mean_interval(values: Sequence[float],
                  resamples: int = 10000,
                  seed: int = 0,
                  level: float = 0.95) -> Dict[str, float]:
    """The mean of paired gains and its bootstrap percentile interval.

    Args:
        values (Sequence[float]): one gain per repeat.
        resamples (int): bootstrap resamples.
        seed (int): their seed.
        level (float): the coverage.

    Returns:
        dict: ``mean``, ``low``, ``high``.
    """
    check_finite_array(values, 'values')
    check_float('level', level, 0, 1, low_open=True, high_open=True)
    check_int('resamples', resamples, 1)
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values),
                                size=(resamples, len(values)))].mean(1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return dict(mean=float(values.mean()), low=float(low), high=float(high))


def deployment_gains(rescorer: Rescorer,
                     evaluator: CocoEvaluator,
                     train_prior: np.ndarray,
                     indices: Sequence[int],
                     num_labelled: int = 32,
                     repeats: int = 10,
                     seed: int = 0,
                     progress: bool = False,
                     desc: str = 'site prior draws',
                     **fit_kwargs) -> Dict:
    """A site's prior measured as a user deploys it: estimated from
    ``num_labelled`` labelled images of the site, evaluated on the site's
    other images, against E_t, over ``repeats`` random draws of the
    labelled images.

    Each draw scores two priors: the raw estimate of the labelled images
    (:func:`~mmcalidet.priors.batch_prior`) and the prior
    :func:`fit_site_prior` fits on them.

    Args:
        rescorer (Rescorer): the detector on the cached site images.
        evaluator (CocoEvaluator): their annotations.
        train_prior (np.ndarray): E_t.
        indices (Sequence[int]): the site's cached images.
        num_labelled (int): n, the labelled images of a draw.
        repeats (int): draws.
        seed (int): their seed.
        progress (bool): show a progress bar over the draws.
        desc (str): its label.
        **fit_kwargs: :func:`fit_site_prior`'s options (``resamples``
            defaults to 1000, which the default ``accept`` needs, and to 0
            with ``accept='gain'``: the reported interval is over the
            draws).

    Returns:
        dict: ``num_labelled``, ``repeats``, ``raw`` and ``fitted`` (each
        ``mean``, ``low``, ``high``: the AP gain over E_t on the other
        images, its bootstrap 95 % interval over the draws, AP points,
        and ``gains``, one per draw) and ``alphas`` (chosen per draw).
    """
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) <= num_labelled:
        raise ValueError(f'{len(indices)} site images leave none to '
                         f'evaluate on after {num_labelled} labelled ones')
    accept = fit_kwargs.setdefault('accept', DEFAULT_ACCEPT)
    fit_kwargs.setdefault('resamples', 1000 if accept == 'interval' else 0)
    cache = rescorer.cache
    labels, img_ids = cache.gt_label_lists(), cache.img_ids()
    rng = np.random.default_rng(seed)
    gains: Dict[str, List[float]] = dict(raw=[], fitted=[])
    alphas = []
    # E_t's matches once: its AP on any draw's other images follows
    base_matches = evaluator.image_matches([img_ids[i] for i in indices],
                                           rescorer.predict(
                                               train_prior, indices))
    position = {int(i): p for p, i in enumerate(indices)}
    for draw in progress_bar(
            range(int(repeats)), desc=desc, enabled=progress, unit='draw'):
        order = rng.permutation(len(indices))
        labelled = indices[order[:num_labelled]]
        rest = indices[order[num_labelled:]]
        fit = fit_site_prior(
            rescorer,
            evaluator,
            train_prior,
            seed=seed + draw,
            indices=labelled,
            **fit_kwargs)
        raw = batch_prior(len(train_prior), [labels[i] for i in labelled])
        # the raw statistics' support: the labelled images (alpha 1)
        register_site_support(rescorer, train_prior, raw,
                              [labels[i] for i in labelled], 1.0)
        ids = [img_ids[i] for i in rest]
        base = base_matches.ap([position[int(i)] for i in rest])
        for name, prior in (('raw', raw), ('fitted', fit.prior)):
            if name == 'fitted' and fit.alpha == 0:
                gains[name].append(0.0)  # E_t itself
                continue
            ap = evaluator.evaluate_ap(ids, rescorer.predict(prior, rest))
            gains[name].append(100 * (ap - base))
        alphas.append(fit.alpha)
    out = dict(
        num_labelled=int(num_labelled), repeats=int(repeats), alphas=alphas)
    for name, values in gains.items():
        out[name] = dict(mean_interval(values, seed=seed), gains=values)
    return out


#: the dense sweep of a site's prior from E_t (0) past its own statistics
#: (1): does the detector read the direction of the shift, not only its
#: presence pattern?
SWEEP_ALPHAS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)


def shrinkage_sweep(rescorer: Rescorer,
                    evaluator: CocoEvaluator,
                    train_prior: np.ndarray,
                    site_prior: np.ndarray,
                    indices: Sequence[int],
                    alphas: Sequence[float] = SWEEP_ALPHAS) -> List[Dict]:
    """AP of a site's images under ``E_t + alpha (E_site - E_t)`` for each
    alpha (:func:`shrink`). A detector that reads the relations gains
    along positive alpha on a site whose own statistics help, peaking near
    1, and loses along negative alpha (the shift reversed).

    Args:
        rescorer (Rescorer): the detector on the cached images.
        evaluator (CocoEvaluator): their annotations.
        train_prior (np.ndarray): E_t.
        site_prior (np.ndarray): E_site.
        indices (Sequence[int]): the site's cached images.
        alphas (Sequence[float]): the points of the sweep.

    Returns:
        list[dict]: per alpha ``alpha``, ``AP`` (points) and ``gain``
        over alpha 0 (E_t) in points.
    """
    check_alphas(alphas, positive=False)
    indices = np.asarray(indices, dtype=np.int64)
    img_ids = rescorer.cache.img_ids()
    ids = [img_ids[i] for i in indices]

    def ap(prior):
        return 100 * evaluator.evaluate_ap(ids,
                                           rescorer.predict(prior, indices))

    base = ap(np.asarray(train_prior, dtype=np.float64))
    rows = []
    for alpha in alphas:
        value = base if alpha == 0 else ap(
            shrink(train_prior, site_prior, alpha))
        rows.append(dict(alpha=float(alpha), AP=value, gain=value - base))
    return rows
