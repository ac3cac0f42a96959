# Copyright (c) mmcalidet contributors. All rights reserved.
"""The update of self-calibration (the paper's Algo. 1), shared by the batch
loop (:mod:`.self_calibration`) and the online calibrator (:mod:`.online`).

From E_c and the detector's predictions under it:

* ``E_i``: the relation statistics of the predicted classes (a class is
  present in an image when a detection of it scores >= ``score_thr``);
* ``z`` per image: the max score of each class among those detections
  (0 when the class is not predicted); ``Z[i, j] = mean_x z[j]``;
* ``E_c <- clip(E_c + eta * Z * (E_i - E_c), 0, 1)``, diagonal 1;
* with a trust radius, E_c pulled back toward its start until their mean
  absolute distance is at most the radius.
"""
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..priors import batch_prior
from ..utils.validation import check_finite_array, check_float, check_int

#: default score threshold for "class predicted" (see
#: docs/user_guides/self_calibrate.md for how it was chosen)
DEFAULT_SCORE_THR = 0.3
#: the paper's step size
DEFAULT_ETA = 4.0
#: how far self-calibration may move E_c from E_t (mean absolute distance):
#: chosen on simulated sites of the training data, where the paper's
#: unbounded loop lost 1.6 to 5.2 AP (projects/context_shift/README.md);
#: ``None`` gives the paper's Algo. 1
DEFAULT_TRUST_RADIUS = 0.05


def _field(pred, key: str, n: int = 0) -> np.ndarray:
    """A prediction's ``scores`` or ``labels`` as an array of numbers.

    Raises:
        ValueError: naming prediction ``n``: no such field, or values that
            are not numbers.
    """
    if hasattr(pred, 'pred_instances'):
        pred = pred.pred_instances
    if isinstance(pred, dict):
        value = pred.get(key)
    elif isinstance(pred, (str, bytes)):
        value = None
    else:
        value = getattr(pred, key, None)
    if value is None:
        raise ValueError(f'prediction {n} has no {key!r}: give per image a '
                         'DetDataSample with pred_instances, an InstanceData '
                         f'or a dict of scores and labels, got '
                         f'{type(pred).__name__}')
    if hasattr(value, 'detach'):
        value = value.detach().cpu().numpy()
    value = np.asarray(value)
    if value.dtype.kind not in 'biuf':
        raise ValueError(f'prediction {n}: {key} must be numbers, got dtype '
                         f'{value.dtype}')
    return value


def prediction_statistics(
        predictions: Sequence,
        num_classes: int,
        score_thr: float = DEFAULT_SCORE_THR) -> Tuple[np.ndarray, np.ndarray]:
    """E_i and z of a set of predictions.

    Args:
        predictions (Sequence): per image an ``InstanceData`` (or a
            ``DetDataSample`` with ``pred_instances``, or a dict) with
            ``scores`` and ``labels``.
        num_classes (int): K.
        score_thr (float): a class is present when a detection of it
            scores at least this.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``E_i`` (K x K, the statistics of
        the present classes; a column whose class is never predicted is
        0.5) and ``z`` (N x K, the max score of each present class per
        image, 0 elsewhere). Non-finite scores count as 0 (their
        sources, a prior or a cache, are checked where they are read).

    Raises:
        ValueError: ``score_thr`` is not in [0, 1], or a prediction without
            numeric ``scores`` and ``labels`` of one length, with a finite
            score outside [0, 1] or a label that is not an integer (one
            line naming it).
    """
    check_float('score_thr', score_thr, 0, 1)
    label_lists = []
    z = np.zeros((len(predictions), num_classes))
    for n, pred in enumerate(predictions):
        scores = _field(pred, 'scores', n).astype(np.float64).reshape(-1)
        given = _field(pred, 'labels', n).reshape(-1)
        labels = given.astype(np.int64)
        if scores.shape != labels.shape:
            raise ValueError(f'prediction {n} has {scores.size} scores and '
                             f'{labels.size} labels')
        if labels.size and not np.array_equal(labels, given):
            raise ValueError(f'prediction {n} has labels that are not '
                             f'integers, e.g. {given[labels != given][0]!r}')
        scores = np.where(np.isfinite(scores), scores, 0.0)
        if scores.size and (scores.min() < 0 or scores.max() > 1):
            bad = scores[(scores < 0) | (scores > 1)][0]
            raise ValueError(f'prediction {n} has a score of {bad:.6g}: '
                             'scores must lie in [0, 1]')
        keep = scores >= score_thr
        labels, scores = labels[keep], scores[keep]
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f'prediction labels must lie in [0, '
                             f'{num_classes}), got {labels.min()}..'
                             f'{labels.max()}')
        np.maximum.at(z[n], labels, scores)
        label_lists.append(np.unique(labels))
    return batch_prior(num_classes, label_lists), z


def update_target(prior: np.ndarray, stats: np.ndarray,
                  z_mean: np.ndarray) -> np.ndarray:
    """The prior an update of Algo. 1 moves E_c towards: ``E_i`` in the
    columns of the classes predicted (``z_mean > 0``), E_c's own columns
    elsewhere (``Z`` is 0 there, so they do not move), diagonal 1.

    Args:
        prior (np.ndarray): E_c (K x K).
        stats (np.ndarray): E_i (K x K).
        z_mean (np.ndarray): (K,) mean over images of z.

    Returns:
        np.ndarray: the target (K x K float64).
    """
    seen = np.nan_to_num(np.asarray(z_mean, dtype=np.float64)) > 0
    target = np.where(seen[None, :], np.asarray(stats, dtype=np.float64),
                      np.asarray(prior, dtype=np.float64))
    np.fill_diagonal(target, 1.0)
    return target


def calibration_step(prior: np.ndarray, stats: np.ndarray, z_mean: np.ndarray,
                     eta: float) -> np.ndarray:
    """One update of Algo. 1: ``clip(E_c + eta * Z * (E_i - E_c), 0, 1)``
    with ``Z[i, j] = z_mean[j]`` and the diagonal reset to 1.

    Args:
        prior (np.ndarray): E_c (K x K).
        stats (np.ndarray): E_i (K x K).
        z_mean (np.ndarray): (K,) mean over images of z.
        eta (float): the step size.

    Returns:
        np.ndarray: the new E_c (K x K float64).

    Raises:
        ValueError: a non-finite input, named (the step size, the prior
            E_c, the statistics or the scores): the update would be NaN.
    """
    check_float('eta (the step size)', eta, 0, low_open=True)
    prior = np.asarray(prior, dtype=np.float64)
    z_mean = np.asarray(z_mean, dtype=np.float64)
    check_finite_array(prior, 'the prior E_c')
    check_finite_array(stats, 'the prediction statistics E_i')
    check_finite_array(z_mean, 'the mean detection scores Z')
    new = prior + eta * z_mean[None, :] * (np.asarray(stats) - prior)
    new = np.clip(new, 0.0, 1.0)
    np.fill_diagonal(new, 1.0)
    return new


def within_trust_region(prior: np.ndarray, center: np.ndarray,
                        radius: Optional[float]) -> np.ndarray:
    """Pull a prior back toward ``center`` (E_t) until its mean absolute
    distance from it is at most ``radius``: ``center + s (prior -
    center)`` with the largest ``s`` in [0, 1] that fits, diagonal 1.

    Args:
        prior (np.ndarray): E_c (K x K).
        center (np.ndarray): the prior it started from.
        radius (float, optional): the largest MAE(E_c, center); ``None``:
            no limit (the paper's Algo. 1).

    Returns:
        np.ndarray: K x K float64.
    """
    check_float('radius', radius, 0, allow_none=True)
    prior = np.asarray(prior, dtype=np.float64)
    if radius is None:
        return prior
    center = np.asarray(center, dtype=np.float64)
    distance = float(np.abs(prior - center).mean())
    if distance <= radius:
        return prior
    out = center + (radius / distance) * (prior - center)
    np.fill_diagonal(out, 1.0)
    return out


def check_self_calibration_args(**kwargs) -> None:
    """Check the numbers of a self-calibration call (batch or online),
    each by its name: ``eta`` > 0, ``score_thr`` in [0, 1], ``tol`` >= 0,
    ``trust_radius`` >= 0 or None, ``momentum`` in [0, 1), ``iters`` and
    ``warmup`` >= 0, ``batch_size``, ``eval_interval`` and
    ``update_interval`` >= 1; all finite.

    Args:
        **kwargs: the arguments given (any subset of those above).

    Raises:
        ValueError: the first bad one, named.
    """
    rules = dict(
        eta=lambda v: check_float('eta', v, 0, low_open=True),
        score_thr=lambda v: check_float('score_thr', v, 0, 1),
        tol=lambda v: check_float('tol', v, 0),
        trust_radius=lambda v: check_float(
            'trust_radius', v, 0, allow_none=True),
        momentum=lambda v: check_float('momentum', v, 0, 1, high_open=True),
        iters=lambda v: check_int('iters', v, 0),
        warmup=lambda v: check_int('warmup', v, 0),
        batch_size=lambda v: check_int('batch_size', v, 1),
        eval_interval=lambda v: check_int('eval_interval', v, 1),
        update_interval=lambda v: check_int('update_interval', v, 1))
    for name, value in kwargs.items():
        rules[name](value)


def deployment_support_arrays(model) -> Optional[Tuple[Any, Any]]:
    """A CaliDet model's deployment (support, marginals) as arrays, or
    ``None`` where it has none (the default start support of E_c)."""
    found = model.deployment_support() if hasattr(
        model, 'deployment_support') else (None, None)
    if any(t is None for t in found):
        return None
    return tuple(t.detach().cpu().numpy() for t in found)
