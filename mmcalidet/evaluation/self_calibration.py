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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.structures import InstanceData

from ..priors import batch_prior, prior_mae, validate_prior
from ..utils.progress import progress_bar

#: default score threshold for "class predicted" (see
#: docs/user_guides/self_calibrate.md for how it was chosen)
DEFAULT_SCORE_THR = 0.3
#: the paper's step size
DEFAULT_ETA = 4.0


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
        image, 0 elsewhere). Non-finite scores count as 0.
    """
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


def presence_accuracy(
        predictions: Sequence,
        label_lists: Sequence[Sequence[int]],
        num_classes: int,
        score_thr: float = DEFAULT_SCORE_THR) -> Dict[str, float]:
    """How well the classes a detector predicts in each image (a detection
    scoring >= ``score_thr``, as :func:`prediction_statistics` counts
    them) match the classes annotated there: the image-level presence
    that self-calibration turns into ``E_i``.

    Args:
        predictions (Sequence): per image, as for
            :func:`prediction_statistics`.
        label_lists (Sequence[Sequence[int]]): per image the annotated
            class indices.
        num_classes (int): K.
        score_thr (float): as for :func:`prediction_statistics`.

    Returns:
        dict: ``precision`` (predicted (image, class) pairs that are
        annotated) and ``recall`` (annotated pairs that are predicted);
        ``nan`` when there is nothing to divide by.
    """
    if len(predictions) != len(label_lists):
        raise ValueError(f'{len(predictions)} predictions for '
                         f'{len(label_lists)} label lists')
    _, z = prediction_statistics(predictions, num_classes, score_thr)
    truth = np.zeros_like(z, dtype=bool)
    for n, labels in enumerate(label_lists):
        truth[n, np.asarray(labels, dtype=np.int64)] = True
    hits = float(((z > 0) & truth).sum())
    predicted, annotated = float((z > 0).sum()), float(truth.sum())
    return dict(
        precision=hits / predicted if predicted else float('nan'),
        recall=hits / annotated if annotated else float('nan'))


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


#: the score thresholds :func:`fit_reference` compares
FIT_THRESHOLDS = tuple(round(0.1 + 0.05 * k, 2) for k in range(17))
#: the annotated images the tools sample for :func:`reference_from_images`
DEFAULT_REFERENCE_IMAGES = 500


@dataclass
class PredictionReference:
    """How a detector's own statistics err where the truth is known:
    annotated images drawn like its training set, scored under E_t.

    Attributes:
        score_thr (float): the threshold at which the predictions'
            statistics ``E_i`` lie closest (MAE) to the annotated ones.
        bias (np.ndarray): ``E_i - truth`` at that threshold (K x K), 0 in
            the columns of classes that are not both predicted and
            annotated there and on the diagonal.
        rows (list[dict]): per threshold compared: ``score_thr``,
            ``epsilon`` (MAE of E_i to the truth), ``precision`` and
            ``recall`` (:func:`presence_accuracy`).
        num_images (int): the annotated images.
    """
    score_thr: float
    bias: np.ndarray
    rows: List[Dict] = field(default_factory=list)
    num_images: int = 0


def fit_reference(
        predictions: Sequence,
        label_lists: Sequence[Sequence[int]],
        num_classes: int,
        thresholds: Sequence[float] = FIT_THRESHOLDS) -> PredictionReference:
    """Choose the score threshold of self-calibration, and measure the bias
    of the statistics it gives, on annotated images (e.g. a sample of the
    training set, which E_t describes): the threshold whose ``E_i`` lies
    closest to the annotated statistics (the lowest on a tie).

    Args:
        predictions (Sequence): per image, as for
            :func:`prediction_statistics` (under the prior the loop starts
            from).
        label_lists (Sequence[Sequence[int]]): per image the annotated
            class indices.
        num_classes (int): K.
        thresholds (Sequence[float]): the thresholds to compare.

    Returns:
        PredictionReference: the threshold, the bias at it and the
        comparison.
    """
    if not len(predictions) or len(predictions) != len(label_lists):
        raise ValueError(f'{len(predictions)} predictions for '
                         f'{len(label_lists)} label lists: need the same '
                         'number, at least one')
    if not len(thresholds):
        raise ValueError('no score threshold to compare')
    truth = batch_prior(num_classes, label_lists)
    annotated = np.zeros(num_classes, dtype=bool)
    for labels in label_lists:
        annotated[np.asarray(labels, dtype=np.int64)] = True
    rows, best = [], None
    for thr in sorted(float(t) for t in thresholds):
        stats, z = prediction_statistics(predictions, num_classes, thr)
        row = dict(
            score_thr=thr,
            epsilon=prior_mae(stats, truth),
            **presence_accuracy(predictions, label_lists, num_classes, thr))
        rows.append(row)
        if best is None or row['epsilon'] < best[0]['epsilon']:
            best = (row, stats, z)
    row, stats, z = best
    known = annotated & (z.max(0) > 0)
    bias = np.where(known[None, :], stats - truth, 0.0)
    np.fill_diagonal(bias, 0.0)
    return PredictionReference(row['score_thr'], bias, rows, len(predictions))


def reference_from_images(model,
                          images,
                          label_lists: Sequence[Sequence[int]],
                          init_prior=None,
                          correction=None,
                          thresholds: Sequence[float] = FIT_THRESHOLDS,
                          batch_size: int = 8,
                          pipeline=None,
                          progress: bool = False) -> PredictionReference:
    """:func:`fit_reference` on annotated images scored by ``model`` under
    the prior self-calibration starts from.

    Args:
        model (nn.Module): the detector (as for :func:`self_calibrate`).
        images: a :class:`HiddenStateCache` filled with ``model``, or image
            paths / arrays (cached through the model's test pipeline).
        label_lists (Sequence[Sequence[int]]): their annotated classes.
        init_prior (array-like, optional): the prior to score under;
            default the model's deployment prior (E_t).
        correction (callable, optional): post-hoc correction for a plain
            detector (see :class:`Rescorer`).
        thresholds (Sequence[float]): the thresholds to compare.
        batch_size (int): images per forward.
        pipeline (Callable, optional): the test pipeline of the images
            (default the one of ``model.cfg``, see :func:`cache_images`).
        progress (bool): show a progress bar while caching.

    Returns:
        PredictionReference: see :func:`fit_reference`.
    """
    from .cache import HiddenStateCache, cache_images
    from .scoring import Rescorer
    if init_prior is None and correction is not None:
        raise ValueError('pass init_prior (E_t) with a post-hoc correction')
    cache = images if isinstance(images, HiddenStateCache) else \
        cache_images(model, list(images), batch_size, pipeline,
                     progress=progress)
    return fit_reference(
        Rescorer(model, cache, correction).predict(init_prior), label_lists,
        model.bbox_head.num_classes, thresholds)


def method_references(methods: Sequence,
                      images: Sequence,
                      label_lists: Sequence[Sequence[int]],
                      init_prior,
                      progress: bool = False,
                      batch_size: int = 8) -> Dict[str, PredictionReference]:
    """:func:`reference_from_images` for each method of an evaluation run
    (:class:`~mmcalidet.evaluation.sweep.Method`): methods that share the
    evaluation images' decoder cache (one detector, or a CaliDet that
    keeps a baseline's trunk) share one cache of ``images``.

    Args:
        methods (Sequence[Method]): the methods (those taking a prior).
        images (Sequence): image paths / arrays.
        label_lists (Sequence[Sequence[int]]): their annotated classes.
        init_prior (array-like): E_t.
        progress (bool): show progress bars while caching.
        batch_size (int): images per forward while caching.

    Returns:
        dict: per method name its :class:`PredictionReference`.
    """
    from .cache import cache_images
    caches, out = {}, {}
    for method in methods:
        model = method.rescorer.model
        if id(method.cache) not in caches:
            caches[id(method.cache)] = cache_images(
                model, list(images), batch_size, progress=progress)
        out[method.name] = reference_from_images(model,
                                                 caches[id(method.cache)],
                                                 label_lists, init_prior,
                                                 method.rescorer.correction)
    return out


def debiased_statistics(stats: np.ndarray,
                        bias: Optional[np.ndarray]) -> np.ndarray:
    """``E_i`` less the detector's own bias (:attr:`PredictionReference.
    bias`), clipped to [0, 1], diagonal 1: where the predictions err on
    images the truth of which is known, the error is taken off.

    Args:
        stats (np.ndarray): E_i (K x K).
        bias (np.ndarray, optional): the bias (K x K); ``None``: none.

    Returns:
        np.ndarray: the corrected statistics (K x K float64).
    """
    stats = np.asarray(stats, dtype=np.float64)
    if bias is None:
        return stats
    bias = np.asarray(bias, dtype=np.float64)
    if bias.shape != stats.shape or not np.isfinite(bias).all():
        raise ValueError(f'the statistics bias must be a finite '
                         f'{stats.shape} matrix, got {bias.shape}')
    out = np.clip(stats - bias, 0.0, 1.0)
    np.fill_diagonal(out, 1.0)
    return out


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
    """
    prior = np.asarray(prior, dtype=np.float64)
    z_mean = np.nan_to_num(np.asarray(z_mean, dtype=np.float64))
    new = prior + eta * z_mean[None, :] * (np.asarray(stats) - prior)
    new = np.clip(np.nan_to_num(new, nan=0.5), 0.0, 1.0)
    np.fill_diagonal(new, 1.0)
    return new


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


SHIFT_PARTS = ('all', 'added', 'removed')


def shift_seen(estimate: np.ndarray,
               truth: np.ndarray,
               init_prior: np.ndarray,
               label_lists: Sequence[Sequence[int]],
               part: str = 'all') -> float:
    """How much of the images' true shift from the initial prior an
    estimate moves along: ``<E - E_t, T - E_t> / <T - E_t, T - E_t>`` over
    the off-diagonal entries of the columns of the classes annotated there
    (a column of a class the images never show is a flat 0.5, no shift).
    1: the estimate lands on the truth's shift, 0: it sees none of it,
    negative: it moves against it.

    ``part`` reads one side of the shift: ``'added'`` the entries the
    images raise over E_t (pairs of classes they show together more often,
    ``T > E_t``), ``'removed'`` those they lower (``T < E_t``). The whole
    is the two parts weighted by their squared shift, so a detector that
    drops the pairs a site leaves out but never finds the pairs it adds
    reads well on ``'all'`` and 0 on ``'added'``.

    Args:
        estimate (np.ndarray): the estimate ``E`` (K x K), e.g. the first
            update's target :attr:`SelfCalibrationResult.start_estimate`.
        truth (np.ndarray): the images' annotated statistics ``T``.
        init_prior (np.ndarray): E_t.
        label_lists (Sequence[Sequence[int]]): the annotated classes.
        part (str): ``'all'`` (default), ``'added'`` or ``'removed'``.

    Returns:
        float: the fraction; ``nan`` when the truth does not differ from
        the initial prior in that part.
    """
    if part not in SHIFT_PARTS:
        raise ValueError(f'part must be one of {SHIFT_PARTS}, got {part!r}')
    init_prior = np.asarray(init_prior, dtype=np.float64)
    shift = np.asarray(truth, dtype=np.float64) - init_prior
    moved = np.asarray(estimate, dtype=np.float64) - init_prior
    columns = np.zeros(len(shift), dtype=bool)
    for labels in label_lists:
        columns[np.asarray(labels, dtype=np.int64)] = True
    mask = columns[None, :] & ~np.eye(len(shift), dtype=bool)
    if part == 'added':
        mask &= shift > 0
    elif part == 'removed':
        mask &= shift < 0
    norm = float((shift[mask]**2).sum())
    return float((moved[mask] * shift[mask]).sum()) / norm if norm > 0 \
        else float('nan')


def start_diagnostics(
        result: SelfCalibrationResult,
        label_lists: Sequence[Sequence[int]],
        truth: np.ndarray,
        init_prior: np.ndarray,
        score_thr: float = DEFAULT_SCORE_THR) -> Dict[str, float]:
    """What a self-calibration run's predictions knew of its images before
    any feedback, on annotated images: the loop gains where its own
    statistics are closer to the truth than the initial prior, or come
    closer as the detector predicts better under each new E_c.

    Args:
        result (SelfCalibrationResult): the run.
        label_lists (Sequence[Sequence[int]]): the annotated class indices
            of the run's images, in its order.
        truth (np.ndarray): the images' annotated statistics (K x K).
        init_prior (np.ndarray): E_c at the start (E_t).
        score_thr (float): the run's score threshold.

    Returns:
        dict: ``epsilon_start``, ``epsilon_estimate`` and ``epsilon_end``
        (MAE to ``truth`` of the initial prior, ``result.start_estimate``
        and the final E_c), ``shift_seen_estimate`` and ``shift_seen_end``
        (:func:`shift_seen` of ``result.start_estimate`` and the final
        E_c), ``added_seen_estimate`` and ``removed_seen_estimate`` (the
        same for the estimate, on the pairs the images add to E_t and on
        those they remove), and ``presence_precision`` /
        ``presence_recall`` of the predictions under the initial prior
        (:func:`presence_accuracy`).
    """
    presence = presence_accuracy(result.start_predictions, label_lists,
                                 len(truth), score_thr)
    return dict(
        epsilon_start=prior_mae(truth, init_prior),
        epsilon_estimate=prior_mae(truth, result.start_estimate),
        epsilon_end=prior_mae(truth, result.prior),
        shift_seen_estimate=shift_seen(result.start_estimate, truth,
                                       init_prior, label_lists),
        shift_seen_end=shift_seen(result.prior, truth, init_prior,
                                  label_lists),
        added_seen_estimate=shift_seen(result.start_estimate, truth,
                                       init_prior, label_lists, 'added'),
        removed_seen_estimate=shift_seen(result.start_estimate, truth,
                                         init_prior, label_lists, 'removed'),
        presence_precision=presence['precision'],
        presence_recall=presence['recall'])


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
                   stats_bias: Optional[np.ndarray] = None,
                   progress: bool = False) -> SelfCalibrationResult:
    """Self-calibrate a frozen detector on a set of images (Algo. 1).

    Args:
        model (nn.Module): a CaliDet detector (or a plain one with a
            post-hoc ``correction``). Its parameters and deployment prior
            are left unchanged; inject ``result.prior`` to deploy it.
        images: a :class:`HiddenStateCache` filled with ``model``, or a
            list of image paths / arrays (cached here through the model's
            test pipeline, see :func:`cache_images`).
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
        stats_bias (np.ndarray, optional): the detector's own statistics
            bias (:attr:`PredictionReference.bias`), taken off ``E_i``
            before each update (:func:`debiased_statistics`); ``None``:
            the paper's update.
        progress (bool): show a progress bar over iterations.

    Returns:
        SelfCalibrationResult: final E_c, per-iteration history and the
        final predictions.
    """
    from .cache import HiddenStateCache, cache_images
    from .scoring import Rescorer
    if eta <= 0 or iters < 0 or tol < 0 or eval_interval < 1:
        raise ValueError('eta must be > 0, iters and tol >= 0, '
                         'eval_interval >= 1')
    cache = images if isinstance(images, HiddenStateCache) else \
        cache_images(model, list(images))
    rescorer = Rescorer(model, cache, correction, batch_size)
    k = rescorer.num_classes
    if init_prior is None:
        if not hasattr(model, 'get_prior'):
            raise ValueError('pass init_prior (E_t) for a model without a '
                             'deployment prior')
        init_prior = model.get_prior()
    prior = validate_prior(init_prior, num_classes=k)
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
            stats = debiased_statistics(stats, stats_bias)
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
            new = calibration_step(prior, stats, z_mean, eta)
            step = np.abs(new - prior)
            step_mae, step_max = float(step.mean()), float(step.max())
            prior = new
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
        cache (HiddenStateCache): the evaluation images.
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
