# Copyright (c) mmcalidet contributors. All rights reserved.
"""Self-calibration (the paper's Algo. 1) on cached decoder outputs.

``E_c <- E_t``; each iteration re-scores the images under ``E_c`` and

* ``E_i``: the relation statistics of the predicted classes (a class is
  present in an image when a detection of it scores >= ``score_thr``);
* ``z`` per image: the max score of each class among those detections
  (0 when the class is not predicted); ``Z[i, j] = mean_x z[j]``;
* ``E_c <- clip(E_c + eta * Z * (E_i - E_c), 0, 1)``, diagonal 1.

Re-scoring uses :class:`~mmcalidet.evaluation.scoring.Rescorer`, so the
backbone and transformer run once per image, not once per iteration.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.structures import InstanceData

from ..priors import batch_prior, validate_prior
from ..utils.progress import progress_bar
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


def _field(pred, key: str) -> np.ndarray:
    if hasattr(pred, 'pred_instances'):
        pred = pred.pred_instances
    value = pred[key] if isinstance(pred, dict) else getattr(pred, key)
    if hasattr(value, 'detach'):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


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
        ValueError: ``score_thr`` is not in [0, 1].
    """
    check_float('score_thr', score_thr, 0, 1)
    label_lists = []
    z = np.zeros((len(predictions), num_classes))
    for n, pred in enumerate(predictions):
        scores = _field(pred, 'scores').astype(np.float64).reshape(-1)
        labels = _field(pred, 'labels').astype(np.int64).reshape(-1)
        scores = np.where(np.isfinite(scores), scores, 0.0)
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


@dataclass
class SelfCalibrationResult:
    """The outcome of :func:`self_calibrate`.

    Attributes:
        prior (np.ndarray): the final E_c.
        history (list[dict]): per iteration (0 = E_t): ``iter``, the
            metrics (when evaluated), ``step_mae`` and ``step_max`` (of the
            update that produced this E_c; 0 at iteration 0), and
            ``num_present`` (mean predicted classes per image under the
            E_c of that iteration).
        predictions (list[InstanceData]): detections under the final E_c.
        converged (bool): stopped because step MAX < tol.
        start_estimate (np.ndarray, optional): the detector's own
            statistics under the initial prior, as the first update moves
            towards them (:func:`update_target`): compare it with the true
            prior of the images to see whether the predictions know more
            than E_t before any feedback.
        start_predictions (list[InstanceData]): detections under the
            initial prior (those ``start_estimate`` comes from).
    """
    prior: np.ndarray
    history: List[Dict] = field(default_factory=list)
    predictions: List[InstanceData] = field(default_factory=list)
    converged: bool = False
    start_estimate: Optional[np.ndarray] = None
    start_predictions: List[InstanceData] = field(default_factory=list)


def deployment_support_arrays(model) -> Optional[Tuple[Any, Any]]:
    """A CaliDet model's deployment (support, marginals) as arrays, or
    ``None`` where it has none (the default start support of E_c)."""
    found = model.deployment_support() if hasattr(
        model, 'deployment_support') else (None, None)
    if any(t is None for t in found):
        return None
    return tuple(t.detach().cpu().numpy() for t in found)


def self_calibrate(model,
                   images,
                   eta: float = DEFAULT_ETA,
                   iters: int = 20,
                   score_thr: float = DEFAULT_SCORE_THR,
                   tol: float = 1e-3,
                   init_prior=None,
                   evaluate: Optional[Callable[[List[InstanceData]],
                                               Dict[str, float]]] = None,
                   indices: Optional[Sequence[int]] = None,
                   correction=None,
                   batch_size: int = 64,
                   eval_interval: int = 1,
                   progress: bool = False,
                   trust_radius: Optional[float] = DEFAULT_TRUST_RADIUS,
                   init_support: Optional[Tuple[Any, Any]] = None
                   ) -> SelfCalibrationResult:
    """Self-calibrate a frozen detector on a set of images (Algo. 1).

    Args:
        model (nn.Module): a CaliDet detector (or a plain one with a
            post-hoc ``correction``). Its parameters and deployment prior
            are left unchanged; inject ``result.prior`` to deploy it.
        images: a :class:`~mmcalidet.decoder_cache.DecoderCache` filled
            with ``model`` (a DETR), a :class:`FeatureCache` of it (a one-
            or two-stage CaliDet detector), or a list of image paths /
            arrays (cached here through the model's test pipeline, see
            :func:`~mmcalidet.evaluation.head_scoring.rescorer_for`).
        eta (float): step size. Defaults to 4.0 (the paper's).
        iters (int): maximum number of updates.
        score_thr (float): the score from which a class counts as
            predicted. Defaults to :data:`DEFAULT_SCORE_THR`.
        tol (float): stop when the step MAX is below it (0 disables).
        init_prior (array-like, optional): E_c at the start; default the
            model's deployment prior (E_t).
        evaluate (callable, optional): ``evaluate(predictions) -> metrics``
            called at every iteration (e.g. COCO AP when annotations
            exist).
        indices (Sequence[int], optional): the cached images to use
            (default all).
        correction (callable, optional): post-hoc correction for a plain
            detector (see :class:`Rescorer`).
        batch_size (int): images per re-scoring step.
        eval_interval (int): call ``evaluate`` every this many iterations
            (and at the first and the last); COCO evaluation can cost more
            than re-scoring.
        progress (bool): show a progress bar over iterations.
        trust_radius (float, optional): keep E_c within this mean absolute
            distance of the initial prior (:func:`within_trust_region`
            after every update). Defaults to :data:`DEFAULT_TRUST_RADIUS`;
            ``None``: no limit, the paper's Algo. 1.
        init_support (tuple, optional): experimental, for a CaliFormer
            that reads a prior's support: the start prior's (support,
            marginals), (K,) each, which every E_c keeps (E_c is the start
            moved by the images' predictions, within the trust radius).
            Default: the model's deployment support when ``init_prior`` is
            not given (:meth:`set_prior`), else none.

    Returns:
        SelfCalibrationResult: final E_c, per-iteration history and the
        final predictions.
    """
    from .head_scoring import rescorer_for
    check_self_calibration_args(
        eta=eta,
        iters=iters,
        score_thr=score_thr,
        tol=tol,
        batch_size=batch_size,
        eval_interval=eval_interval,
        trust_radius=trust_radius)
    rescorer = rescorer_for(model, images, correction, batch_size)
    k = rescorer.num_classes
    if init_prior is None:
        if not hasattr(model, 'get_prior'):
            raise ValueError('pass init_prior (E_t) for a model without a '
                             'deployment prior')
        init_prior = model.get_prior()
        if init_support is None:
            init_support = deployment_support_arrays(model)
    prior = validate_prior(init_prior, num_classes=k)
    if init_support is not None:
        rescorer.register_support(prior, *init_support)
    center = prior.copy()
    history: List[Dict] = []
    step_mae = step_max = 0.0
    converged = False
    preds: List[InstanceData] = []
    start_estimate, start_preds = None, []
    with progress_bar(
            desc='self-calibration', enabled=progress, total=iters + 1) as bar:
        for it in range(iters + 1):
            preds = rescorer.predict(prior, indices)
            stats, z = prediction_statistics(preds, k, score_thr)
            z_mean = z.mean(0) if len(z) else np.zeros(k)
            if it == 0:
                start_estimate = update_target(prior, stats, z_mean)
                start_preds = preds
            record = dict(
                iter=it,
                step_mae=step_mae,
                step_max=step_max,
                num_present=float((z > 0).sum(1).mean()) if len(z) else 0.)
            last = it == iters or converged
            if evaluate is not None and (last or it % eval_interval == 0):
                record.update(evaluate(preds))
            history.append(record)
            bar.update(1)
            if last:
                break
            new = within_trust_region(
                calibration_step(prior, stats, z_mean, eta), center,
                trust_radius)
            step = np.abs(new - prior)
            step_mae, step_max = float(step.mean()), float(step.max())
            prior = new
            if init_support is not None:
                rescorer.register_support(prior, *init_support)
            converged = tol > 0 and step_max < tol
    return SelfCalibrationResult(prior, history, preds, converged,
                                 start_estimate, start_preds)


def mean_history(histories: Sequence[List[Dict]]) -> List[Dict]:
    """Average per-iteration records over runs (e.g. subsets). A run that
    stopped early keeps its last record for the later iterations; ``nan``
    values are left out of the mean.

    Args:
        histories (Sequence[list[dict]]): ``SelfCalibrationResult.history``
            of each run.

    Returns:
        list[dict]: per iteration the mean of every numeric key, plus
        ``num_runs``.
    """
    histories = [h for h in histories if h]
    if not histories:
        return []
    length = max(len(h) for h in histories)
    keys = [k for k in histories[0][0] if k != 'iter']
    out = []
    for it in range(length):
        recs = [h[min(it, len(h) - 1)] for h in histories]
        row = dict(iter=it, num_runs=len(recs))
        for key in keys:
            vals = np.array([r.get(key, np.nan) for r in recs], dtype=float)
            row[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() \
                else float('nan')
        out.append(row)
    return out


def self_calibrate_partitions(model,
                              cache,
                              partitions: Sequence[np.ndarray],
                              evaluate: Optional[Callable] = None,
                              progress: bool = False,
                              **kwargs) -> Dict:
    """Self-calibrate separately on each partition of a cache (random
    subsets, :func:`~mmcalidet.evaluation.partitions.calibration_subsets`,
    or deployment sites).

    Args:
        model (nn.Module): the detector that filled ``cache``.
        cache (DecoderCache | FeatureCache): the evaluation images.
        partitions (Sequence[np.ndarray]): image indices of each run.
        evaluate (callable, optional): ``evaluate(cache, predictions,
            indices) -> metrics`` (e.g. :func:`cache_evaluator`).
        progress (bool): show a progress bar over partitions.
        **kwargs: passed to :func:`self_calibrate` (``eta``, ``iters``,
            ``score_thr``, ``tol``, ``init_prior``, ``correction``, ...).

    Returns:
        dict: ``subsets`` (the index arrays), ``results``
        (:class:`SelfCalibrationResult` per partition) and ``mean`` (the
        averaged history, :func:`mean_history`).
    """
    results = []
    for idx in progress_bar(
            partitions, desc='self-calibration runs', enabled=progress):
        ev = None
        if evaluate is not None:
            ev = (lambda preds, idx=idx: evaluate(cache, preds, idx))
        results.append(
            self_calibrate(model, cache, evaluate=ev, indices=idx, **kwargs))
    return dict(
        subsets=list(partitions),
        results=results,
        mean=mean_history([r.history for r in results]))
