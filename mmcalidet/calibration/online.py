# Copyright (c) mmcalidet contributors. All rights reserved.
"""Online self-calibration from a stream of predictions.

The paper suggests it (Sec. 4.4, "running statistics from the past
predictions"); this is our design. Instead of re-scoring a fixed set of
images, :class:`OnlineSelfCalibrator` keeps exponentially weighted
statistics of the detector's recent predictions and applies the update of
Algo. 1 to them every ``update_interval`` images:

* presence ``p`` (K,) of each image (classes with a detection scoring >=
  ``score_thr``) and ``z`` (K,) (their max scores, 0 elsewhere);
* with ``m = momentum`` per image: ``C <- m C + p p^T``, ``n <- m n + p``,
  ``s <- m s + z``, ``w <- m w + 1``;
* ``E_i = C / n`` (0.5 where ``n`` is ~0, diagonal 1), ``Z[:, j] = s_j /
  w``, ``E_c <- clip(E_c + eta * Z * (E_i - E_c), 0, 1)``, diagonal 1;
  with a ``trust_radius``, E_c is then pulled back toward the starting
  prior until MAE(E_c, E_0) <= radius (as in the batch
  :func:`~mmcalidet.calibration.self_calibrate`).

It works from the outputs of any inference call (a list of mmdet
``DetDataSample`` or ``InstanceData``) and injects E_c with
``model.set_prior``, so it composes with ``model.test_step``,
``mmcalidet.apis.inference_detector`` or a serving loop.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from ..priors import validate_prior
from ..utils.validation import check_finite_array, check_float, check_int
from .update import (DEFAULT_SCORE_THR, DEFAULT_TRUST_RADIUS, calibration_step,
                     check_self_calibration_args, deployment_support_arrays,
                     prediction_statistics, within_trust_region)


class OnlineSelfCalibrator:
    """Stateful self-calibration over a stream of predictions.

    Args:
        num_classes (int, optional): K; default the model's.
        init_prior (array-like, optional): E_c at the start (injected
            into ``model``); default the model's deployment prior (E_t).
            One of ``model`` / ``init_prior`` is required.
        model (nn.Module, optional): a CaliDet detector; every update
            injects E_c into it with ``set_prior``.
        eta (float): step size of an update. Defaults to 1.0: the paper's
            4.0 re-scores a fixed set 20 times, whereas each online update
            sees new images; with ``eta <= 1`` and scores <= 1, ``eta * Z``
            stays <= 1 and E_c never overshoots E_i.
        momentum (float): per-image decay of the running statistics in
            [0, 1); the window is about ``1 / (1 - momentum)`` images.
            Defaults to 0.99 (~100 images).
        score_thr (float): a class is predicted from this score on.
        update_interval (int): images between two updates of E_c.
            Defaults to 16.
        warmup (int): images observed before the first update. Defaults
            to 32.
        trust_radius (float, optional): keep E_c within this mean absolute
            distance of ``init_prior``. Defaults to
            :data:`~mmcalidet.calibration.DEFAULT_TRUST_RADIUS` (chosen on
            streamed validation sites, as the batch default); ``None``: no
            limit.
        init_support (tuple, optional): experimental, for a CaliFormer
            that reads a prior's support: the start prior's (support,
            marginals), (K,) each, injected with every E_c. Default: the
            model's deployment support when ``init_prior`` is not given.
    """

    def __init__(self,
                 num_classes: Optional[int] = None,
                 init_prior=None,
                 model=None,
                 eta: float = 1.0,
                 momentum: float = 0.99,
                 score_thr: float = DEFAULT_SCORE_THR,
                 update_interval: int = 16,
                 warmup: int = 32,
                 trust_radius: Optional[float] = DEFAULT_TRUST_RADIUS,
                 init_support: Optional[Tuple[Any, Any]] = None) -> None:
        check_self_calibration_args(
            eta=eta,
            momentum=momentum,
            score_thr=score_thr,
            update_interval=update_interval,
            warmup=warmup,
            trust_radius=trust_radius)
        if model is not None and num_classes is None:
            num_classes = getattr(
                getattr(model, 'bbox_head', None), 'num_classes', None)
        if init_prior is None and model is not None and \
                hasattr(model, 'get_prior'):
            init_prior = model.get_prior()
            if init_support is None:
                init_support = deployment_support_arrays(model)
        #: the start prior's (support, marginals), kept by every E_c
        self.init_support = None if init_support is None else tuple(
            np.asarray(t, dtype=np.float64).copy() for t in init_support)
        if init_prior is None:
            raise ValueError('pass a CaliDet model or init_prior (E_t)')
        self.prior = validate_prior(init_prior, num_classes=num_classes)
        self.num_classes = self.prior.shape[0]
        self.model = model
        self.init_prior = self.prior.copy()
        self.eta = float(eta)
        self.momentum = float(momentum)
        self.score_thr = float(score_thr)
        self.update_interval = int(update_interval)
        self.warmup = int(warmup)
        self.trust_radius = None if trust_radius is None else float(
            trust_radius)
        self.reset(keep_prior=True)
        self._inject()

    def reset(self, keep_prior: bool = False) -> None:
        """Forget the running statistics (and E_c unless ``keep_prior``)."""
        k = self.num_classes
        self.pair_counts = np.zeros((k, k))
        self.counts = np.zeros(k)
        self.score_sum = np.zeros(k)
        self.weight = 0.0
        self.num_images = 0
        self.num_updates = 0
        self._since_update = 0
        self.last_step = dict(step_mae=0.0, step_max=0.0)
        if not keep_prior:
            self.prior = self.init_prior.copy()
            self._inject()

    def observe(self, predictions: Sequence) -> None:
        """Add the predictions of some images to the running statistics
        (E_c is not changed).

        Args:
            predictions (Sequence): per image a ``DetDataSample`` with
                ``pred_instances`` or an ``InstanceData`` (``scores``,
                ``labels``); a single one is accepted too.
        """
        if not isinstance(predictions, (list, tuple)):
            predictions = [predictions]
        m = self.momentum
        for pred in predictions:
            _, z = prediction_statistics([pred], self.num_classes,
                                         self.score_thr)
            z = z[0]
            present = (z > 0).astype(np.float64)
            self.pair_counts *= m
            self.pair_counts += np.outer(present, present)
            self.counts = m * self.counts + present
            self.score_sum = m * self.score_sum + z
            self.weight = m * self.weight + 1.0
            self.num_images += 1
            self._since_update += 1

    def running_statistics(self) -> Dict[str, np.ndarray]:
        """``E_i`` (K x K) and ``z_mean`` (K,) of the running window."""
        k = self.num_classes
        stats = np.full((k, k), 0.5)
        seen = self.counts > 1e-12
        stats[:, seen] = self.pair_counts[:, seen] / self.counts[seen]
        np.fill_diagonal(stats, 1.0)
        z_mean = self.score_sum / self.weight if self.weight > 0 else \
            np.zeros(k)
        return dict(stats=np.clip(stats, 0.0, 1.0), z_mean=z_mean)

    def step(self) -> Dict[str, float]:
        """Apply one update of E_c from the running statistics (and inject
        it into the model).

        Returns:
            dict: ``step_mae`` and ``step_max`` of the update.
        """
        running = self.running_statistics()
        new = calibration_step(self.prior, running['stats'], running['z_mean'],
                               self.eta)
        new = within_trust_region(new, self.init_prior, self.trust_radius)
        diff = np.abs(new - self.prior)
        self.prior = new
        self.num_updates += 1
        self._since_update = 0
        self.last_step = dict(
            step_mae=float(diff.mean()), step_max=float(diff.max()))
        self._inject()
        return self.last_step

    def update(self, predictions: Sequence) -> bool:
        """Observe predictions, then update E_c when due (after ``warmup``
        images, every ``update_interval`` images).

        Returns:
            bool: whether E_c was updated.
        """
        self.observe(predictions)
        if self.num_images >= self.warmup and \
                self._since_update >= self.update_interval:
            self.step()
            return True
        return False

    def _inject(self) -> None:
        if self.model is not None and hasattr(self.model, 'set_prior'):
            if self.init_support is None:
                self.model.set_prior(self.prior)
            else:
                support, marginals = self.init_support
                self.model.set_prior(
                    self.prior, support=support, marginals=marginals)

    def state_dict(self) -> dict:
        """The calibrator's state (numpy arrays and numbers)."""
        return dict(
            prior=self.prior.copy(),
            pair_counts=self.pair_counts.copy(),
            counts=self.counts.copy(),
            score_sum=self.score_sum.copy(),
            weight=self.weight,
            num_images=self.num_images,
            num_updates=self.num_updates,
            since_update=self._since_update)

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (and inject its E_c).

        Raises:
            ValueError: one line naming the problem: not a dict, missing or
                unknown keys, arrays of another K, non-finite or negative
                statistics, counts that are not integers >= 0. Nothing is
                changed then.
        """
        if not isinstance(state, dict):
            raise ValueError('OnlineSelfCalibrator state must be a dict (of '
                             f'state_dict()), got {type(state).__name__}')
        keys = set(self.state_dict())
        problems = [
            f'{what} {names}'
            for what, names in (('missing', sorted(keys - set(state))),
                                ('unknown', sorted(set(state) - keys)))
            if names
        ]
        if problems:
            raise ValueError(f'OnlineSelfCalibrator state: '
                             f'{"; ".join(problems)} (expected the keys '
                             f'{sorted(keys)})')
        k = self.num_classes
        prior = validate_prior(state['prior'], k)
        arrays = {}
        for key, shape in (('pair_counts', (k, k)), ('counts', (k, )),
                           ('score_sum', (k, ))):
            try:
                value = np.array(state[key], dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f'OnlineSelfCalibrator state: {key} must '
                                 'be numbers') from None
            if value.shape != shape:
                raise ValueError(f'OnlineSelfCalibrator state: {key} must '
                                 f'be {shape} for K={k}, got {value.shape}')
            check_finite_array(value, f'OnlineSelfCalibrator state: {key}')
            if value.size and value.min() < 0:
                raise ValueError(f'OnlineSelfCalibrator state: {key} must '
                                 'be >= 0')
            arrays[key] = value
        where = 'OnlineSelfCalibrator state:'
        weight = check_float(f'{where} weight', state['weight'], 0)
        counts = {
            key: check_int(f'{where} {key}', state[key], 0)
            for key in ('num_images', 'num_updates', 'since_update')
        }
        self.prior = prior
        self.pair_counts = arrays['pair_counts']
        self.counts = arrays['counts']
        self.score_sum = arrays['score_sum']
        self.weight = weight
        self.num_images = counts['num_images']
        self.num_updates = counts['num_updates']
        self._since_update = counts['since_update']
        self._inject()


def stream_site(rescorer,
                evaluate: Callable,
                indices: Sequence[int],
                train_prior: np.ndarray,
                trust_radius: Optional[float],
                batch_size: int = 16,
                seed: int = 0,
                **options) -> Dict:
    """Stream a site's cached images through an
    :class:`OnlineSelfCalibrator` started at E_t.

    Args:
        rescorer (Rescorer): the detector's re-scorer over the cache.
        evaluate (callable): ``evaluate(cache, predictions, indices)``.
        indices (Sequence[int]): the site's images (cache indices).
        train_prior (np.ndarray): E_t, the calibrator's start.
        trust_radius (float, optional): the calibrator's trust radius.
        batch_size (int): images per arriving batch.
        seed (int): seed of the (fixed) arrival order.
        **options: more ``OnlineSelfCalibrator`` options.

    Returns:
        dict: ``AP_start`` (E_t on the same images), ``AP_stream`` (the
        streamed predictions), ``gain``, ``updates`` and ``prior`` (E_c at
        the end).

    Raises:
        ValueError: a bad ``trust_radius`` or ``batch_size``, named.
    """
    check_self_calibration_args(
        trust_radius=trust_radius, batch_size=batch_size)
    order = np.random.default_rng(seed).permutation(np.asarray(indices))
    # a support-aware CaliFormer: E_c keeps E_t's registered support
    support = rescorer.support_of(train_prior)
    calibrator = OnlineSelfCalibrator(
        init_prior=train_prior,
        trust_radius=trust_radius,
        init_support=support,
        **options)
    predictions = []
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        out = rescorer.predict(calibrator.prior, batch)
        predictions.extend(out)
        if calibrator.update(out) and support is not None:
            rescorer.register_support(calibrator.prior, *support)
    cache = rescorer.cache
    # E_t on the site's images as the other tables score them (an image's
    # detections do not depend on its batch; the AP not on the order)
    indices = np.asarray(indices)
    start_ap = evaluate(cache, rescorer.predict(train_prior, indices),
                        indices)['AP']
    stream_ap = evaluate(cache, predictions, order)['AP']
    return dict(
        AP_start=start_ap,
        AP_stream=stream_ap,
        gain=stream_ap - start_ap,
        updates=calibrator.num_updates,
        prior=calibrator.prior)
