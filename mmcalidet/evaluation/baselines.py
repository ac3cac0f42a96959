# Copyright (c) mmcalidet contributors. All rights reserved.
"""Post-hoc prior corrections for a plain (not CaliDet-trained) detector.

What a user might do instead of training CaliDet: keep a plain DINO and
correct its sigmoid scores with the same prior E at test time. Both
corrections act on the last decoder layer's logits (B, Q, K) before the
head's top-k, take the prior as a K x K matrix or a (B, K, K) stack (per
image, e.g. the oracle E_x), and are the identity at the reference prior
E_ref (the training statistics E_t the detector has implicitly learned),
so "DINO + correction at E_t" is the plain DINO.

* :class:`PriorReweighting` -- *marginal re-weighting*: the label-shift
  correction of Saerens et al. (2002) applied per class to the sigmoid
  odds, ``logit' = logit + logit(pi_target) - logit(pi_source)``. The
  source marginals are the training class frequencies; the target
  marginals scale them by how much more often E says a class appears next
  to the other classes than E_ref does (E holds conditionals only, so the
  marginals it implies are relative). It ignores which classes an image
  shows. On a softmax classifier (a two-stage detector's RoI head) it is
  Saerens et al.'s own form: ``PriorReweighting.softmax_shift``.
* :class:`CooccurrenceRescoring` -- *co-occurrence rescoring* (a simple
  context rescoring of our own, in the spirit of classical co-occurrence
  context models, not a published method): every class c gets the
  evidence ``logit E[c, j] - logit E_ref[c, j]`` of the other classes j,
  weighted by the detector's confidence that j is in the image (its max
  score for j), ``logit' = logit + beta * weighted mean``.
"""
from typing import Dict, Optional

import numpy as np
import torch
from torch import Tensor

from ..priors.checks import validate_prior
from ..priors.prior import Prior
from ..utils.validation import check_finite_array, check_float

CORRECTIONS = ('reweight', 'cooccurrence')

#: display names of the corrections (used in tables)
CORRECTION_NAMES = {
    'reweight': 'marginal re-weighting',
    'cooccurrence': 'co-occurrence rescoring',
}


def _logit(p: Tensor, eps: float) -> Tensor:
    p = p.clamp(eps, 1 - eps)
    return torch.log(p) - torch.log1p(-p)


def _as_tensor(x, like: Tensor) -> Tensor:
    x = getattr(x, 'matrix', x)  # a Prior is taken as its matrix
    return torch.as_tensor(
        np.asarray(x) if not isinstance(x, Tensor) else x,
        dtype=like.dtype,
        device=like.device)


def _check_logits(logits: Tensor, num_classes: int) -> None:
    if logits.dim() != 3 or logits.shape[-1] != num_classes:
        raise ValueError('post-hoc corrections take sigmoid logits (B, Q, '
                         f'K={num_classes}), got {tuple(logits.shape)}')


def _ref_prior(ref_prior, owner: str) -> np.ndarray:
    """E_ref checked as a prior (a :class:`Prior`'s matrix, or a K x K
    matrix of numbers in [0, 1], diagonal 1), as float64."""
    try:
        return validate_prior(getattr(ref_prior, 'matrix', ref_prior))
    except ValueError as exc:
        raise ValueError(f'{owner}: ref_prior (E_ref): {exc}') from None


def _check_priors(priors: Tensor,
                  num_classes: int,
                  owner: str,
                  batch: Optional[int] = None) -> None:
    """The priors a correction is called with: (K, K) or (B, K, K) of
    this K and (``batch`` given) the logits' B, finite, in [0, 1] (a
    NaN would make every logit NaN)."""
    k = num_classes
    if priors.dim() not in (2, 3) or tuple(priors.shape[-2:]) != (k, k):
        raise ValueError(f'{owner}: priors must be (K, K) or (B, K, K) '
                         f'with K={k} (the reference prior\'s), got shape '
                         f'{tuple(priors.shape)}')
    if batch is not None and priors.dim() == 3 and \
            priors.shape[0] != batch:
        raise ValueError(f'{owner}: {priors.shape[0]} priors for a batch of '
                         f'{batch} images (logits of B={batch})')
    check_finite_array(priors, f'{owner}: the priors')
    if priors.numel() and (priors.min() < -1e-6 or priors.max() > 1 + 1e-6):
        bad = ((priors < -1e-6) | (priors > 1 + 1e-6)).nonzero()[0].tolist()
        raise ValueError(f'{owner}: prior values must lie in [0, 1], got '
                         f'{priors[tuple(bad)].item():.6g} at index '
                         f'{tuple(bad)}')


def class_frequencies(prior: Prior) -> np.ndarray:
    """Image-level class frequencies ``n_c / N`` of the training set: the
    marginals of E_t's support (its file's ``images_per_class`` over
    ``num_images``, or ``support_images``, as written by
    ``tools/analysis_tools/compute_prior.py``), validated when the prior
    was made.

    Args:
        prior (Prior): E_t, in the evaluation's class order.

    Returns:
        np.ndarray: (K,) frequencies, kept within (0, 1) (a class in no
        image, or in every one, would give an infinite logit).

    Raises:
        ValueError: E_t records no support.
    """
    if not prior.has_support:
        raise ValueError(f'{prior.name} records no images_per_class / '
                         'num_images: marginal re-weighting needs the '
                         'training class frequencies')
    return np.clip(np.array(prior.marginals), 1e-6, 1 - 1e-6)


class PriorReweighting:
    """Marginal re-weighting of sigmoid scores (Saerens-style).

    Args:
        ref_prior (array-like): E_ref (K x K), the training statistics.
        class_freq (array-like): (K,) training image-level frequencies.
        eps (float): clipping of probabilities before ``logit``.
    """

    def __init__(self, ref_prior, class_freq, eps: float = 1e-4) -> None:
        check_float('eps', eps, 0, 0.5, low_open=True, high_open=True)
        self.ref_prior = _ref_prior(ref_prior, 'PriorReweighting')
        k = self.ref_prior.shape[0]
        try:
            self.class_freq = np.asarray(class_freq, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError('PriorReweighting: class_freq must be (K,) '
                             f'numbers: {exc}') from None
        if self.class_freq.shape != (k, ):
            raise ValueError(f'PriorReweighting: class_freq must be (K,) = '
                             f'({k},) as ref_prior is {k} x {k}, got shape '
                             f'{self.class_freq.shape}')
        check_finite_array(self.class_freq, 'PriorReweighting: class_freq')
        if np.any(self.class_freq <= 0) or np.any(self.class_freq >= 1):
            c = int(np.argmax((self.class_freq <= 0) | (self.class_freq >= 1)))
            raise ValueError('PriorReweighting: class frequencies must lie '
                             f'in (0, 1), got {self.class_freq[c]:.6g} at '
                             f'index {c}')
        self.eps = eps
        self.weights = self.class_freq / self.class_freq.sum()

    def implied_presence(self, priors: Tensor) -> Tensor:
        """``m(i) = sum_{j != i} E[i, j] w_j / sum_{j != i} w_j``, the rate
        at which E puts class i next to a class drawn by training
        frequency; (K,) or (B, K)."""
        w = _as_tensor(self.weights, priors)
        k = w.shape[0]
        off = priors * (1 -
                        torch.eye(k, dtype=priors.dtype, device=priors.device))
        return torch.matmul(off, w) / (w.sum() - w).clamp_min(1e-12)

    def target_marginals(self, priors: Tensor) -> Tensor:
        """pi_target = pi_source * m_E / m_ref, clipped to (0, 1)."""
        ref = self.implied_presence(_as_tensor(self.ref_prior, priors))
        freq = _as_tensor(self.class_freq, priors)
        ratio = self.implied_presence(priors) / ref.clamp_min(1e-12)
        return (freq * ratio).clamp(self.eps, 1 - self.eps)

    def softmax_shift(self, priors: Tensor) -> Tensor:
        """The correction of a softmax classifier (a RoI head's K classes
        and background): Saerens et al.'s own form, each foreground
        logit plus ``log(pi_target / pi_source)``, the background's
        unchanged (its marginal kept).

        Args:
            priors (Tensor): (K, K) or (B, K, K).

        Returns:
            Tensor: the shift of the K foreground logits, (K,) or (B, K).
        """
        _check_priors(priors, self.ref_prior.shape[0], 'PriorReweighting')
        freq = _as_tensor(self.class_freq, priors)
        return torch.log(self.target_marginals(priors)) - torch.log(freq)

    def __call__(self, logits: Tensor, priors) -> Tensor:
        """Corrected logits.

        Args:
            logits (Tensor): (B, Q, K) sigmoid logits.
            priors (Tensor): (K, K) or (B, K, K).

        Returns:
            Tensor: (B, Q, K).
        """
        _check_logits(logits, self.ref_prior.shape[0])
        priors = _as_tensor(priors, logits)
        _check_priors(priors, self.ref_prior.shape[0], 'PriorReweighting',
                      logits.shape[0])
        freq = _as_tensor(self.class_freq, logits)
        shift = _logit(self.target_marginals(priors), self.eps) - _logit(
            freq, self.eps)
        shift = shift if shift.dim() == 2 else shift[None]
        return logits + shift[:, None, :]


class CooccurrenceRescoring:
    """Co-occurrence rescoring of sigmoid scores with E directly.

    Args:
        ref_prior (array-like): E_ref (K x K), the training statistics.
        beta (float): strength of the context term. Defaults to 1.0.
        eps (float): clipping of E before ``logit``. Defaults to 0.01.
    """

    def __init__(self,
                 ref_prior,
                 beta: float = 1.0,
                 eps: float = 0.01) -> None:
        self.beta = check_float('beta', beta)
        self.eps = check_float('eps', eps, 0, 0.5, low_open=True,
                               high_open=True)
        self.ref_prior = _ref_prior(ref_prior, 'CooccurrenceRescoring')

    def __call__(self, logits: Tensor, priors) -> Tensor:
        """Corrected logits.

        Args:
            logits (Tensor): (B, Q, K) sigmoid logits.
            priors (Tensor): (K, K) or (B, K, K).

        Returns:
            Tensor: (B, Q, K).
        """
        k = self.ref_prior.shape[0]
        _check_logits(logits, k)
        priors = _as_tensor(priors, logits)
        _check_priors(priors, k, 'CooccurrenceRescoring', logits.shape[0])
        if priors.dim() == 2:
            priors = priors.expand(logits.shape[0], k, k)
        ref = _as_tensor(self.ref_prior, logits)
        evidence = _logit(priors, self.eps) - _logit(ref, self.eps)
        evidence = evidence * (
            1 - torch.eye(k, dtype=logits.dtype, device=logits.device))
        presence = logits.sigmoid().amax(dim=1)  # (B, K): max score of j
        num = torch.einsum('bcj,bj->bc', evidence, presence)
        den = presence.sum(-1, keepdim=True) - presence
        return logits + self.beta * (num / den.clamp_min(1e-6))[:, None, :]


def build_correction(name: str,
                     ref_prior,
                     class_freq: Optional[np.ndarray] = None,
                     **kwargs):
    """A post-hoc correction by name (:data:`CORRECTIONS`).

    Args:
        name (str): ``'reweight'`` or ``'cooccurrence'``.
        ref_prior (array-like): E_ref, the training statistics.
        class_freq (np.ndarray, optional): training class frequencies
            (``'reweight'`` needs them).
        **kwargs: the correction's options (``beta``, ``eps``).

    Returns:
        callable: ``correction(logits, priors) -> logits``.

    Raises:
        ValueError: an unknown name, or what the correction's constructor
            refuses (E_ref not a prior: NaN, values outside [0, 1]; class
            frequencies of another K, NaN or outside (0, 1)).
    """
    if name == 'reweight':
        if class_freq is None:
            raise ValueError('marginal re-weighting needs the training '
                             'class frequencies')
        return PriorReweighting(ref_prior, class_freq, **kwargs)
    if name == 'cooccurrence':
        return CooccurrenceRescoring(ref_prior, **kwargs)
    raise ValueError(f'unknown correction {name!r}; choose from '
                     f'{list(CORRECTIONS)}')


def describe_corrections() -> Dict[str, str]:
    """One line per correction, for reports."""
    return {
        'reweight':
        'marginal re-weighting: Saerens-style label-shift '
        'correction of each class\'s sigmoid odds, target marginals implied '
        'by E (relative to E_ref) and the training class frequencies',
        'cooccurrence':
        'co-occurrence rescoring: logit E[c, j] - logit '
        'E_ref[c, j] of the other classes j, weighted by the detector\'s max '
        'score for j (our simple context baseline)',
    }
