# Copyright (c) mmcalidet contributors. All rights reserved.
"""A site's prior measured as a user deploys it: fitted on a few labelled
site images (:func:`~mmcalidet.calibration.fit_site_prior`), scored on
the site's other images against E_t, over random draws of the labelled
images (the deployment table of :mod:`mmcalidet.evaluation.protocol`).
"""
from typing import Dict, List, Sequence

import numpy as np

from ..evaluation.bootstrap import mean_interval
from ..evaluation.coco import CocoEvaluator
from ..evaluation.scoring import Rescorer
from ..priors import batch_prior
from ..utils.progress import progress_bar
from .cross_fitting import register_site_support
from .site_prior import DEFAULT_ACCEPT, fit_site_prior


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
