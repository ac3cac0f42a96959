# Copyright (c) mmcalidet contributors. All rights reserved.
"""The standard injection table (the paper's Sec. 4.2, Tab. 2).

A CaliDet model is evaluated under priors from misleading to accurate:
``flip(E_x)``, ``E0``, ``E_t``, ``E_v``, ``E_b`` (each evaluation batch),
``E_x`` (each image); all but E0 and E_t are computed from the ground
truth of the evaluation images (oracle). Expected: AP non-decreasing in
that order. Plain detectors appear as one row (no prior) and, with a
post-hoc correction, one row per prior. The priors are kinds of
:mod:`mmcalidet.priors.kinds` (looked up by name), or user priors given as
``LABEL=SOURCE``.
"""
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..decoder_cache import DecoderCache
from ..priors import PRIOR_KINDS, KindInputs, load_prior_source, prior_label
from ..utils.progress import progress_bar
from ..utils.validation import check_float
from .scoring import PriorArg, Rescorer

#: the paper's priors, from the most misleading to the most accurate
STANDARD_PRIORS = ('flip_E_x', 'E0', 'E_t', 'E_v', 'E_b', 'E_x')

#: does the detector read relations, not only which classes are present?
#: E_x and flip(E_x) with the columns of absent classes E_t's (no presence
#: pattern): a detector that reads the content scores them in this order
CONTENT_PRIORS = ('filled_flip_E_x', 'E_t', 'filled_E_x')


@dataclass
class PriorSpec:
    """A prior to evaluate under.

    Attributes:
        key (str): identifier (``E_t``, ``flip_E_x``, a user label).
        label (str): how tables print it.
        oracle (bool): computed from the evaluation set's ground truth.
        prior: a K x K matrix or a per-image callable (see
            :data:`~mmcalidet.evaluation.scoring.PriorArg`).
        note (str): one-line description.
    """
    key: str
    label: str
    oracle: bool
    prior: PriorArg
    note: str = ''


@dataclass
class Method:
    """A detector (and how it uses a prior) that tables compare.

    Attributes:
        name (str): the row name (``CaliDet``, ``DINO``,
            ``DINO + marginal re-weighting``, ...).
        rescorer (Rescorer): predictions from its cache.
    """
    name: str
    rescorer: Rescorer

    @property
    def takes_prior(self) -> bool:
        return self.rescorer.calibratable or \
            self.rescorer.correction is not None

    @property
    def cache(self) -> DecoderCache:
        return self.rescorer.cache


def parse_prior_names(items: Sequence[str]):
    """Split prior arguments into keys and user priors.

    Args:
        items (Sequence[str]): standard keys (``E_t``, ...) or
            ``LABEL=SOURCE`` (a prior file or shipped name).

    Returns:
        tuple[list[str], dict]: the keys in order and ``{label: source}``.

    Raises:
        ValueError: before any detector pass: an unknown key, a label
            given twice, or a source that is no prior (a missing file, a
            bad matrix; :meth:`~mmcalidet.priors.Prior.load`).
    """
    from ..priors import Prior
    names, extra = [], {}
    for item in items:
        if '=' in item:
            label, src = item.split('=', 1)
            if not label or not src:
                raise ValueError(f'expected LABEL=FILE, got {item!r}')
            try:
                Prior.load(src)
            except ValueError as exc:
                raise ValueError(f'prior {label!r}: {exc}') from None
            extra[label] = src
            item = label
        check_prior_name(item, extra)
        if item in names:
            raise ValueError(f'prior {item!r} is given twice')
        names.append(item)
    return names, extra


def check_prior_name(name: str, extra: Dict[str, object]) -> None:
    """Refuse a prior key that is neither a registered kind
    (:data:`~mmcalidet.priors.PRIOR_KINDS`) nor a label of ``extra``.

    Raises:
        ValueError: naming the key and the choices.
    """
    if name not in extra and name not in PRIOR_KINDS:
        raise ValueError(f'unknown prior {name!r}; choose from '
                         f'{list(PRIOR_KINDS)} or pass it as LABEL=FILE')


def build_priors(names: Sequence[str],
                 label_lists: Sequence[np.ndarray],
                 train_prior: np.ndarray,
                 batch_ids: Optional[Sequence[int]] = None,
                 extra: Optional[Dict[str, object]] = None,
                 classes: Optional[Sequence[str]] = None) -> List[PriorSpec]:
    """Build the named priors for a set of evaluation images.

    Args:
        names (Sequence[str]): prior kinds
            (:data:`~mmcalidet.priors.PRIOR_KINDS`: those of
            :data:`STANDARD_PRIORS`, :data:`CONTENT_PRIORS`, any other
            registered) and keys of ``extra``, in table order.
        label_lists (Sequence[np.ndarray]): ground-truth class indices per
            image (for the oracle priors).
        train_prior (np.ndarray): E_t.
        batch_ids (Sequence[int], optional): evaluation batch per image
            (for E_b; default: all images in one batch, i.e. E_v).
        extra (dict, optional): more priors, label -> prior source (file,
            shipped name or matrix), not oracle.
        classes (Sequence[str], optional): class order for named files.

    Returns:
        list[PriorSpec]: the priors.
    """
    k = train_prior.shape[0]
    extra = dict(extra or {})
    inputs = KindInputs(label_lists, train_prior, batch_ids)
    specs = []
    for name in names:
        if name in extra:
            specs.append(
                PriorSpec(name, name, False,
                          load_prior_source(extra[name], classes, k),
                          'user prior'))
            continue
        check_prior_name(name, extra)
        kind = PRIOR_KINDS[name]
        specs.append(
            PriorSpec(name, kind.label, kind.oracle, kind.build(inputs),
                      kind.note))
    return specs


#: what forked evaluation workers read (inherited, never pickled)
_EVAL_JOBS: Dict = {}


def _evaluate_job(index: int) -> Dict[str, float]:
    cache, preds = _EVAL_JOBS['jobs'][index]
    return _EVAL_JOBS['evaluate'](cache, preds)


def evaluate_priors(methods: Sequence[Method],
                    priors: Sequence[PriorSpec],
                    evaluate: Callable,
                    progress: bool = True,
                    workers: int = 0) -> List[Dict]:
    """Evaluate every method under every prior.

    Args:
        methods (Sequence[Method]): the detectors.
        priors (Sequence[PriorSpec]): the priors (for methods that take
            one; the others give one row with prior ``-``).
        evaluate (callable): ``evaluate(cache, predictions) -> metrics``.
        progress (bool): show a progress bar.
        workers (int): evaluate in this many forked processes (POSIX);
            0 evaluates one after the other. COCO evaluation, not the
            re-scoring, dominates a sweep over a large set.

    Returns:
        list[dict]: one row per (method, prior): ``method``, ``prior``
        (label), ``key``, ``oracle``, the metrics and ``seconds`` (of the
        re-scoring, plus the evaluation when not in workers).
    """
    jobs = []
    for method in methods:
        for spec in (priors if method.takes_prior else [None]):
            jobs.append((method, spec))
    rows, pending = [], []
    for method, spec in progress_bar(jobs, desc='priors', enabled=progress):
        start = time.perf_counter()
        preds = method.rescorer.predict(None if spec is None else spec.prior)
        metrics = {}
        if workers > 0:
            pending.append((method.cache, preds))
        else:
            metrics = evaluate(method.cache, preds)
        rows.append(
            dict(
                method=method.name,
                prior='-' if spec is None else spec.label,
                key=None if spec is None else spec.key,
                oracle=False if spec is None else spec.oracle,
                **metrics,
                seconds=time.perf_counter() - start))
    if pending:
        import multiprocessing
        _EVAL_JOBS.update(jobs=pending, evaluate=evaluate)
        try:
            ctx = multiprocessing.get_context('fork')
            with ctx.Pool(min(workers, len(pending))) as pool:
                results = pool.map(_evaluate_job, range(len(pending)))
        finally:
            _EVAL_JOBS.clear()
        for row, metrics in zip(rows, results):
            seconds = row.pop('seconds')
            row.update(metrics, seconds=seconds)
    return rows


def check_expected_order(rows: Sequence[Dict],
                         method: str,
                         order: Sequence[str] = STANDARD_PRIORS,
                         metric: str = 'AP',
                         tol: float = 0.0) -> Dict:
    """Whether a method's metric increases along ``order``.

    Ties alone prove nothing: the order is decidable only when the values
    spread by more than ``tol``. It then holds when no step decreases by
    more than ``tol`` and the last prior beats the first by more than
    ``tol`` (the effect size). An untrained model (every AP 0.00) is
    therefore ``undecidable``, not ``holds``.

    Args:
        rows (Sequence[dict]): rows of :func:`evaluate_priors`.
        method (str): the method to check.
        order (Sequence[str]): prior keys from worst to best.
        metric (str): the metric.
        tol (float): differences up to ``tol`` (in the metric's units: AP
            in [0, 1], so 0.001 is 0.1 AP points) count as ties.
            Defaults to 0 (any strict difference counts).

    Returns:
        dict: ``verdict`` (``'holds'``, ``'does not hold'`` or
        ``'undecidable (...)'`` with the reason), ``holds`` (bool, ``None``
        when undecidable), ``order`` (the keys checked), ``violations``
        (``'E_t > E_v (49.30 > 49.27)'`` strings), ``spread`` (max - min,
        ``None`` with fewer than two values), ``effect`` (last - first,
        ``None`` likewise) and ``tol``.
    """
    check_float('tol', tol)  # NaN; the sign below
    if tol < 0:
        raise ValueError(f'tol must be >= 0, got {tol}')
    values = {
        r['key']: r[metric]
        for r in rows if r['method'] == method and r.get('key') in order
    }
    keys = [k for k in order if k in values]
    result = dict(
        verdict='',
        holds=None,
        order=keys,
        violations=[],
        spread=None,
        effect=None,
        tol=tol)
    if len(keys) < 2:
        result['verdict'] = 'undecidable (fewer than two priors evaluated)'
        return result
    vals = [values[k] for k in keys]
    if any(v is None or v != v for v in vals):
        result['verdict'] = f'undecidable (a {metric} is missing or NaN)'
        return result
    spread, effect = max(vals) - min(vals), vals[-1] - vals[0]
    result.update(spread=spread, effect=effect)
    if spread <= tol:
        result['verdict'] = (f'undecidable (all {metric}s within '
                             f'{100 * tol:.2f} of each other: spread '
                             f'{100 * spread:.2f})')
        return result

    label = prior_label  # a kind's table label, a user prior's own
    violations = result['violations']
    for a, b in zip(keys, keys[1:]):
        if values[a] - values[b] > tol:
            violations.append(f'{label(a)} > {label(b)} '
                              f'({100 * values[a]:.2f} > '
                              f'{100 * values[b]:.2f})')
    if effect <= tol:
        violations.append(f'{label(keys[-1])} - {label(keys[0])} = '
                          f'{100 * effect:+.2f}, not above the tolerance '
                          f'{100 * tol:.2f}')
    result['holds'] = not violations
    result['verdict'] = 'holds' if not violations else 'does not hold'
    return result


def expected_orders(rows: Sequence[Dict],
                    methods: Sequence[Method],
                    order: Sequence[str] = STANDARD_PRIORS,
                    tol: float = 0.0) -> Dict[str, Dict]:
    """:func:`check_expected_order` of each method that takes a prior.

    Args:
        rows (Sequence[dict]): :func:`evaluate_priors` rows.
        methods (Sequence[Method]): the methods.
        order (Sequence[str]): prior keys from worst to best.
        tol (float): ties up to ``tol`` (AP in [0, 1]).

    Returns:
        dict: method name -> the order's verdict.
    """
    return {
        m.name: check_expected_order(rows, m.name, order, tol=tol)
        for m in methods if m.takes_prior
    }
