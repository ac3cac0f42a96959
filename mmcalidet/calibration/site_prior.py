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
(``absent='flat'``, :func:`~mmcalidet.priors.batch_prior`'s;
:func:`~mmcalidet.priors.site_estimate`). The chosen
candidate is the best of several on the same images, so its
cross-validated gain is optimistic by a little; the interval rule keeps a
like-training site at E_t. It was chosen over ``accept='gain'`` on
simulated sites of the training data (projects/context_shift/README.md):
there ``gain`` moved off E_t on noise and lost on one site of four.

The cross-fitted candidates are :mod:`.cross_fitting`'s; a fit measured
as a user deploys it, over draws of the labelled images, is
:mod:`.site_draws`'.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..evaluation.bootstrap import paired_bootstrap
from ..evaluation.coco import CocoEvaluator
from ..evaluation.scoring import Rescorer
from ..priors import Prior
from ..priors.shrinkage import ABSENT, check_alphas, shrink, site_estimate
from ..utils.validation import check_int
from .cross_fitting import (candidate_gains, cross_fitted_predictions,
                            register_site_support, site_labels)

#: the shrinkage candidates (0 is E_t, the fallback)
ALPHAS = (0.25, 0.5, 0.75, 1.0, 1.25)
#: when a candidate replaces E_t (:func:`fit_site_prior`'s ``accept``)
ACCEPT = ('interval', 'gain')
#: the default: the low end of its gain's interval is above 0
DEFAULT_ACCEPT = 'interval'


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
    labels, img_ids, dropped = site_labels(evaluator, cache, indices)
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, folds)
    candidates = [(form, float(a)) for form in absent for a in alphas]
    predictions = cross_fitted_predictions(rescorer, train_prior, labels,
                                           indices, parts, absent, alphas)
    base = evaluator.image_matches(img_ids,
                                   rescorer.predict(train_prior, indices))
    matches, table = candidate_gains(evaluator, img_ids, predictions,
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
