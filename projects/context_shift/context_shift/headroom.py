# Copyright (c) mmcalidet contributors. All rights reserved.
"""How much a site's statistics can pay: the headroom of each site.

Every figure is the plain detector's AP on a site's images against its AP
there (E_t, the identity of every correction):

- the post-hoc corrections' sweeps, each site's prior moved
  ``E_t + alpha (E_site - E_t)`` (:data:`ALPHAS`): the co-occurrence
  rescoring (a class's logit moved by the site's relation evidence,
  weighted by the classes this image shows) and the marginal re-weighting
  (the site's class marginals, whatever the image shows); the alpha
  fitted on one half;
- two oracles fitted on one half of the site's labelled images and scored
  on the other half (upper bounds, not deployable):

  * *per-class bias*: one logit shift per class, chosen by coordinate
    ascent on the site's AP (what a site's class frequencies can give);
  * *relation term*: ``logit_c += b_c + sum_j A_cj e_j`` with ``e_j`` the
    image's max score of class j (what the image shows), ``A`` (K x K,
    zero diagonal) and ``b`` fitted by logistic regression of each class's
    presence in each image on the image's best logit of that class, then
    scaled by the best of :data:`SCALES` on the site's AP (what weighing a
    site's relations by the image can give at most, in this form).

Split-half, as the benchmark's site tables: each site splits by image
parity into two halves; what a figure fits (its alpha, an oracle) is
fitted on one half, with that half's statistics, and scored on the other;
each half is its own AP and the two directions' gains are averaged, each
with a 90 % paired bootstrap interval. A gain a recipe makes on a site
reads against these.
"""
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

#: the sweep's alphas (the benchmark's, and halfway points)
ALPHAS = (-1.0, -0.5, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
#: the per-class bias oracle's candidate shifts
BIAS_STEPS = (-2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0)
#: the relation oracle's scales of its fitted term
SCALES = (0.25, 0.5, 1.0, 2.0)


class BiasCorrection:
    """``logits + b`` (K,), a per-class shift (a post-hoc correction)."""

    def __init__(self, bias: np.ndarray) -> None:
        self.bias = torch.as_tensor(np.asarray(bias), dtype=torch.float32)

    def __call__(self, logits: Tensor, priors=None) -> Tensor:
        return logits + self.bias.to(logits)


class RelationCorrection:
    """``logits + b + scale * (A e)``: ``e`` (B, K) the image's max score
    per class, ``A`` (K, K) with a zero diagonal."""

    def __init__(self,
                 weights: np.ndarray,
                 bias: np.ndarray,
                 scale: float = 1.0) -> None:
        self.weights = torch.as_tensor(
            np.asarray(weights), dtype=torch.float32)
        self.bias = torch.as_tensor(np.asarray(bias), dtype=torch.float32)
        self.scale = float(scale)

    def __call__(self, logits: Tensor, priors=None) -> Tensor:
        evidence = logits.sigmoid().amax(dim=1)  # (B, K)
        shift = self.bias.to(logits) + evidence @ self.weights.to(logits).T
        return logits + self.scale * shift[:, None, :]


def image_logits(rescorer, indices: np.ndarray) -> Tensor:
    """The plain detector's last-layer logits of cached images, (N, Q, K).

    Args:
        rescorer (Rescorer): the plain detector's scorer (no correction).
        indices (np.ndarray): cached image indices.
    """
    out = []
    with torch.no_grad():
        for start in range(0, len(indices), rescorer.batch_size):
            idx = indices[start:start + rescorer.batch_size]
            hidden, _, _ = rescorer.cache.get(idx, rescorer.device)
            out.append(rescorer.logits(hidden, None).cpu())
    return torch.cat(out)


def fit_relation(logits: Tensor,
                 labels: Sequence[np.ndarray],
                 weight_decay: float = 1e-3,
                 steps: int = 300) -> tuple:
    """The relation oracle's ``A`` and ``b``: a logistic regression of
    each class's presence in each image on its best logit there, shifted by
    ``b_c + sum_{j != c} A_cj e_j``.

    Args:
        logits (Tensor): (N, Q, K) the plain detector's logits.
        labels (Sequence[np.ndarray]): the classes of each image.
        weight_decay (float): the L2 penalty of ``A`` and ``b``.
        steps (int): L-BFGS iterations.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``A`` (K, K) and ``b`` (K,).
    """
    num, _, k = logits.shape
    best = logits.amax(dim=1).double()
    evidence = logits.sigmoid().amax(dim=1).double()
    target = torch.zeros(num, k, dtype=torch.float64)
    for i, present in enumerate(labels):
        target[i, np.asarray(present, dtype=np.int64)] = 1.0
    off = 1 - torch.eye(k, dtype=torch.float64)
    weights = torch.zeros(k, k, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    optim = torch.optim.LBFGS([weights, bias],
                              max_iter=steps,
                              line_search_fn='strong_wolfe')

    def closure():
        optim.zero_grad()
        shift = bias + evidence @ (weights * off).T
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            best + shift, target) + weight_decay * (
                (weights * off).pow(2).sum() + bias.pow(2).sum())
        loss.backward()
        return loss

    optim.step(closure)
    return (weights * off).detach().numpy(), bias.detach().numpy()


def fit_bias(ap: Callable[[np.ndarray], float],
             num_classes: int,
             passes: int = 2) -> tuple:
    """The per-class bias oracle by coordinate ascent on ``ap(bias)``.

    Args:
        ap (callable): the site's AP under a (K,) bias.
        num_classes (int): K.
        passes (int): sweeps over the classes.

    Returns:
        tuple[np.ndarray, float]: the bias and its AP.
    """
    bias = np.zeros(num_classes)
    best = ap(bias)
    for _ in range(passes):
        for c in range(num_classes):
            for step in BIAS_STEPS:
                trial = bias.copy()
                trial[c] = step
                score = ap(trial)
                if score > best + 1e-9:
                    best, bias = score, trial
    return bias, best


def _fitted_gain(evaluator, cache, halves, scored, boot: Dict) -> Dict:
    """The split-half gain of a fitted correction: ``scored(fit, score)``
    gives the predictions of half ``score`` under what was fitted on half
    ``fit`` (``None``: E_t, no fit); each half its own AP, the halves'
    gains averaged, with the paired bootstrap's interval."""
    from mmcalidet.evaluation.split_half import gain_of
    img_ids = cache.img_ids()
    h0, h1 = halves.halves
    ids = [img_ids[i] for i in np.concatenate([h0, h1])]
    strata = [np.arange(len(h0)), len(h0) + np.arange(len(h1))]
    own = evaluator.image_matches(ids, scored(1, 0) + scored(0, 1))
    base = evaluator.image_matches(ids, scored(None, 0) + scored(None, 1))
    return gain_of(own, base, strata, **boot)


def site_headroom(plain, corrections: Dict[str, object], evaluator,
                  train_prior: np.ndarray, halves,
                  labels: Sequence[np.ndarray], boot: Dict) -> Dict:
    """The headroom row of one site, split-half: everything a figure
    fits (a correction's alpha, an oracle) is fitted on one half (with
    that half's statistics) and scored on the other, each half its own AP,
    the two directions' gains averaged (AP in points, gains over E_t,
    90 % paired bootstrap intervals).

    Args:
        plain (Rescorer): the plain detector's scorer.
        corrections (dict): name -> the post-hoc correction's scorer
            (``'reweight'``, ``'cooccurrence'``).
        evaluator (CocoEvaluator): the annotations.
        train_prior (np.ndarray): E_t.
        halves (SiteHalves): the site's halves and their statistics.
        labels (Sequence[np.ndarray]): the classes of every cached image.
        boot (dict): ``resamples``, ``seed``, ``level`` of the bootstrap.

    Returns:
        dict: ``base`` (AP at E_t, the halves' mean); per correction
        ``<name>`` (gain), ``<name>_interval`` and ``<name>_alpha`` (the
        alpha fitted on each half); ``bias``, ``relation`` (the oracles'
        gains) with their intervals and ``relation_scale`` (per half).
    """
    from mmcalidet.evaluation.scoring import Rescorer
    from mmcalidet.priors import shrink
    img_ids = plain.cache.img_ids()

    def ap_of(scorer, prior, half) -> float:
        idx = halves.halves[half]
        return 100 * evaluator.evaluate_ap([img_ids[i] for i in idx],
                                           scorer.predict(prior, idx))

    def corrected(fn) -> Rescorer:
        return Rescorer(plain.model, plain.cache, fn, plain.batch_size)

    row = dict(base=float(np.mean([ap_of(plain, None, h) for h in (0, 1)])))

    def base_or(fn):
        return lambda fit, h: plain.predict(None, halves.halves[h]) \
            if fit is None else fn(fit, h)

    for name, scorer in corrections.items():
        # alpha fitted on the half whose statistics it shrinks toward
        alphas = [
            max(ALPHAS,
                key=lambda a: ap_of(
                    scorer, shrink(train_prior, halves.priors[f], a), f))
            for f in (0, 1)
        ]
        res = _fitted_gain(
            evaluator, plain.cache, halves,
            base_or(lambda f, h: scorer.predict(
                shrink(train_prior, halves.priors[f], alphas[f]), halves.
                halves[h])), boot)
        row.update({
            name: res['gain'],
            f'{name}_interval': res['interval'],
            f'{name}_alpha': alphas
        })
    k = plain.num_classes
    biases = [
        fit_bias(lambda b: ap_of(corrected(BiasCorrection(b)), train_prior, f),
                 k)[0] for f in (0, 1)
    ]
    res = _fitted_gain(
        evaluator, plain.cache, halves,
        base_or(lambda f, h: corrected(BiasCorrection(biases[f])).predict(
            train_prior, halves.halves[h])), boot)
    row.update(bias=res['gain'], bias_interval=res['interval'])
    fits, scales = [], []
    for f in (0, 1):
        idx = halves.halves[f]
        weights, bias = fit_relation(
            image_logits(plain, idx), [labels[i] for i in idx])
        fits.append((weights, bias))
        scales.append(
            max(SCALES,
                key=lambda s: ap_of(
                    corrected(RelationCorrection(weights, bias, s)),
                    train_prior, f)))
    res = _fitted_gain(
        evaluator, plain.cache, halves,
        base_or(
            lambda f, h: corrected(RelationCorrection(*fits[f], scales[
                f])).predict(train_prior, halves.halves[h])), boot)
    row.update(
        relation=res['gain'],
        relation_interval=res['interval'],
        relation_scale=scales)
    return row


def headroom_rows(setup,
                  groups: List[str],
                  site_prior: Dict[str, np.ndarray],
                  parts: Dict[str, np.ndarray],
                  progress: Optional[Callable[[str], None]] = None,
                  resamples: int = 1000) -> List[Dict]:
    """One :func:`site_headroom` row per site (split-half).

    Args:
        setup (EvalSetup): the plain detector (its first method) and its
            corrections (``posthoc=['reweight', 'cooccurrence']``).
        groups (list[str]): the site of each cached image.
        site_prior (dict): site -> E_site (all its images: the epsilon
            column).
        parts (dict): site -> its image indices.
        progress (callable, optional): called with each site's name.
        resamples (int): bootstrap resamples of each interval.

    Returns:
        list[dict]: ``site``, ``images``, ``epsilon`` and the row's
        figures.
    """
    from mmcalidet.evaluation.split_half import INTERVAL_LEVEL, site_halves
    from mmcalidet.priors import prior_mae
    plain = setup.methods[0].rescorer
    if plain.correction is not None or plain.calibratable:
        raise ValueError('the first method must be the plain detector')
    corrections = {}
    for method in setup.methods[1:]:
        name = 'reweight' if 're-weighting' in method.name else \
            'cooccurrence' if 'co-occurrence' in method.name else None
        if name is not None:
            corrections[name] = method.rescorer
    labels = plain.cache.gt_label_lists()
    boot = dict(resamples=resamples, seed=0, level=INTERVAL_LEVEL)
    rows = []
    for site, idx in parts.items():
        if progress is not None:
            progress(site)
        halves = site_halves(labels, idx, len(setup.train_prior))
        row = site_headroom(plain, corrections, setup.evaluator,
                            setup.train_prior, halves, labels, boot)
        rows.append(
            dict(
                site=site,
                images=len(idx),
                epsilon=prior_mae(site_prior[site], setup.train_prior),
                **row))
    return rows
