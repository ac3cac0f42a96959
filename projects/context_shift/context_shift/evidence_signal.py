# Copyright (c) mmcalidet contributors. All rights reserved.
"""How much a prior's relations, weighed by what an image shows, tell about
that image: the training signal a relation term could learn from.

For a (prior E, image) pair, the image's class evidence ``e_j`` (the
detector's best score of class j in the image) and best logit ``m_i``
predict whether class i is in the image. The relation evidence is the
co-occurrence form

    s_i = sum_{j != i} (logit E_ij - logit E_t,ij) e_j / (1 + sum_{j != i} e_j)

and the *predictive value* of a mode is the mean log-likelihood gain, in
millinats per (image, class), of ``sigmoid(a m_i + c + beta s_i)`` over
``sigmoid(a m_i + c)`` (``a``, ``c`` fitted on the images; ``beta >= 0``
fitted on half of the mode's pairs and the gain measured on the other
half). A mode whose value is at or under 0 holds nothing a relation term
could learn to read; one above 0 does, if its pairs are the ones training
shows (a prior with the images it calibrates).
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np

#: probabilities of E clipped before the logit
CLIP = 0.02
#: the betas searched
BETAS = tuple(np.round(np.linspace(0, 3, 31), 2))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, CLIP, 1 - CLIP)
    return np.log(p) - np.log1p(-p)


def relation_evidence(prior: np.ndarray, e_t: np.ndarray,
                      evidence: np.ndarray) -> np.ndarray:
    """``s`` (N, K) of one prior for N images' evidence (N, K)."""
    k = prior.shape[0]
    delta = (_logit(prior) - _logit(e_t)) * (1 - np.eye(k))
    num = evidence @ delta.T
    den = 1 + evidence.sum(-1, keepdims=True) - evidence
    return num / den


def fit_presence(best: np.ndarray, present: np.ndarray,
                 steps: int = 200) -> Tuple[float, float]:
    """``a``, ``c`` of ``sigmoid(a m + c)`` for presence, by Newton steps
    on all (image, class) pairs."""
    m, y = best.ravel(), present.ravel().astype(np.float64)
    a, c = 1.0, 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(a * m + c)))
        g = np.array([np.sum((p - y) * m), np.sum(p - y)])
        w = p * (1 - p)
        h = np.array([[np.sum(w * m * m), np.sum(w * m)],
                      [np.sum(w * m), np.sum(w)]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(h, g)
        a, c = a - step[0], c - step[1]
        if np.abs(step).max() < 1e-10:
            break
    return float(a), float(c)


def _loglik(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0, -z) * y - np.logaddexp(0, z) * (1 - y)


def mode_value(pairs: Sequence[Tuple[np.ndarray, np.ndarray]],
               best: np.ndarray, evidence: np.ndarray,
               present: np.ndarray, e_t: np.ndarray,
               presence_fit: Tuple[float, float]) -> Dict[str, float]:
    """The predictive value of one mode's (prior, image indices) pairs.

    Args:
        pairs (Sequence[tuple]): (K x K prior, the indices of the images it
            calibrates).
        best (np.ndarray): (N, K) each image's best logit per class.
        evidence (np.ndarray): (N, K) its best score per class.
        present (np.ndarray): (N, K) bool, the classes it shows.
        e_t (np.ndarray): E_t.
        presence_fit (tuple): ``a``, ``c`` of :func:`fit_presence`.

    Returns:
        dict: ``value`` (millinats per image and class, on the held-out
        half), ``beta`` (fitted on the other half) and ``pairs``.
    """
    a, c = presence_fit
    halves: List[List[np.ndarray]] = [[], []]
    for n, (prior, idx) in enumerate(pairs):
        idx = np.asarray(idx, dtype=np.int64)
        s = relation_evidence(prior, e_t, evidence[idx])
        base = a * best[idx] + c
        halves[n % 2].append(
            np.stack([base, s, present[idx].astype(np.float64)]))
    if not halves[0] or not halves[1]:
        raise ValueError('a mode needs at least two pairs')
    fit, test = (np.concatenate([h.reshape(3, -1) for h in part], axis=1)
                 for part in halves)

    def gain(beta, data):
        base, s, y = data
        return np.mean(_loglik(base + beta * s, y) - _loglik(base, y))

    beta = max(BETAS, key=lambda b: gain(b, fit))
    return dict(value=1000 * gain(beta, test), beta=float(beta),
                pairs=len(pairs))
