# Copyright (c) mmcalidet contributors. All rights reserved.
"""Self-calibration (the paper's Algo. 1) of a frozen detector on a set of
images: ``E_c <- E_t``, then each iteration re-scores the images under
``E_c`` and applies the update of :mod:`.update`.

Re-scoring uses :class:`~mmcalidet.evaluation.scoring.Rescorer` (or the
head re-scorer of a one- or two-stage detector), so the backbone and
transformer run once per image, not once per iteration.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.structures import InstanceData

from ..evaluation.head_scoring import rescorer_for
from ..priors import validate_prior
from ..utils.progress import progress_bar
from .update import (DEFAULT_ETA, DEFAULT_SCORE_THR, DEFAULT_TRUST_RADIUS,
                     calibration_step, check_self_calibration_args,
                     deployment_support_arrays, prediction_statistics,
                     update_target, within_trust_region)


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


def self_calibrate(
        model,
        images,
        eta: float = DEFAULT_ETA,
        iters: int = 20,
        score_thr: float = DEFAULT_SCORE_THR,
        tol: float = 1e-3,
        init_prior=None,
        evaluate: Optional[Callable[[List[InstanceData]], Dict[str,
                                                               float]]] = None,
        indices: Optional[Sequence[int]] = None,
        correction=None,
        batch_size: int = 64,
        eval_interval: int = 1,
        progress: bool = False,
        trust_radius: Optional[float] = DEFAULT_TRUST_RADIUS,
        init_support: Optional[Tuple[Any,
                                     Any]] = None) -> SelfCalibrationResult:
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
