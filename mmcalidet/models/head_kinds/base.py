# Copyright (c) mmcalidet contributors. All rights reserved.
"""The registry of head kinds: one adapter per kind of classifying head.

A CaliDet detector classifies with one of three kinds of head: a DETR's
decoder head (``'decoder'``: every decoder layer's linear branch), a
one-stage dense head (``'dense'``: a classification conv per level) or a
two-stage RoI box head (``'roi'``: one linear layer on the RoIs). What
differs between them (which layers classify, what a cache of the head
holds and how the calibrator's loss reads it, what an ONNX export traces
and post-processes, how the evaluation re-scores it) is the kind's
:class:`HeadKind` adapter, and only there: the rest of the package asks
:func:`head_kind_of` and calls the adapter.

:data:`HEAD_KINDS` maps each kind's name to its adapter (a dict, filled by
:func:`register_head_kind`). A calibrated head mixin declares its kind in
the class attribute ``head_kind``; a plain mmdet detector (a baseline) is
claimed by the first adapter whose :meth:`HeadKind.claims` accepts it.

The adapters live in ``mmcalidet.models`` and import nothing above it: the
parts of a kind that belong to the packages above (the cache writer in
:mod:`mmcalidet.decoder_cache`, the export wrapper in
:mod:`mmcalidet.deploy`, the re-scoring in :mod:`mmcalidet.evaluation`)
are named by import path (``'module:attribute'``) and loaded by those
packages with :meth:`HeadKind.part`.
"""
import importlib
from typing import Any, Dict, Optional

from torch import Tensor, nn

#: kind name -> adapter, in registration order
HEAD_KINDS: Dict[str, 'HeadKind'] = {}


def register_head_kind(adapter: 'HeadKind') -> 'HeadKind':
    """Register an adapter under its ``name`` (one per kind).

    Args:
        adapter (HeadKind): the kind's adapter.

    Returns:
        HeadKind: ``adapter``.

    Raises:
        KeyError: a kind of that name is registered already.
    """
    if adapter.name in HEAD_KINDS:
        raise KeyError(f'head kind {adapter.name!r} is registered already')
    HEAD_KINDS[adapter.name] = adapter
    return adapter


def load_part(path: str) -> Any:
    """The object an import path ``'package.module:attribute'`` names.

    Args:
        path (str): the path.

    Returns:
        object: the attribute.
    """
    module, _, attribute = path.partition(':')
    return getattr(importlib.import_module(module), attribute)


class HeadKind:
    """The adapter of one kind of classifying head (see the module).

    A subclass sets the class attributes and implements the methods; an
    instance is registered once with :func:`register_head_kind`.

    Attributes:
        name (str): the kind (a cache's ``meta['head']``).
        export_name (str): the kind an ONNX export's metadata records
            (``meta['head']``).
        words (str): the features of a cache of this kind, in words.
        feature_cache (bool): the evaluation scores it from a
            ``FeatureCache`` (the trunk's features) rather than cached
            decoder outputs.
        softmax (bool): its classifier scores K classes and background
            with a softmax (post-hoc corrections need a softmax form).
        cache_writer (str): the function that fills a training cache of
            this kind, ``fn(model, data, writer, num_locations, seed,
            progress, total)`` (:mod:`mmcalidet.decoder_cache`).
        rescorer (str): the evaluation's re-scorer class
            (:mod:`mmcalidet.evaluation`).
        head_outputs (str): the re-scoring's per-image head outputs
            (a one- or two-stage head's, run once per image), or ''.
        export_wrapper (str): the module an ONNX export traces
            (:mod:`mmcalidet.deploy`).
        export_outputs (tuple[str]): the graph's output names.
        export_settings (str): ``fn(model, wrapper) -> dict``, the
            post-processing settings the export stores for the runtime,
            or ''.
        export_rewrites (str): ``fn(model)``, a context manager the trace
            runs in (rewrites of mmdet's code for the tracer), or ''.
    """
    name = ''
    export_name = ''
    words = ''
    feature_cache = False
    softmax = False
    cache_writer = ''
    rescorer = ''
    head_outputs = ''
    export_wrapper = ''
    export_outputs = ('dets', 'labels')
    export_settings = ''
    export_rewrites = ''

    def part(self, name: str) -> Any:
        """One of the parts named by import path (``'cache_writer'``,
        ``'rescorer'``, ...), loaded.

        Raises:
            ValueError: the kind has no such part.
        """
        path = getattr(self, name, '')
        if not path:
            raise ValueError(f'the {self.name} head kind has no {name}')
        return load_part(path)

    def claims(self, model: nn.Module) -> bool:
        """Whether a detector without a calibrated head (a plain mmdet
        one) has a head of this kind."""
        raise NotImplementedError

    def head(self, model: nn.Module) -> nn.Module:
        """The detector's classifying head (its ``bbox_head``; a two-stage
        detector's box head)."""
        return model.bbox_head

    def cls_layers(self, head: nn.Module) -> Dict[str, nn.Module]:
        """The classification layers, each once, by name in the head: what
        a fold adds ``rho V'`` to and what the calibrator trains with
        ``cache_train_cls_branches``."""
        raise NotImplementedError

    def feature_width(self, head: nn.Module) -> int:
        """The width of one cached feature (what a cache of this kind
        holds per query, location or RoI)."""
        raise NotImplementedError

    def class_weight(self, head: nn.Module) -> Tensor:
        """W (K, d): the class rows of the (last) classifier's weight, on
        the features V' calibrates."""
        raise NotImplementedError

    def fold(self, head: nn.Module, cali_vectors: Tensor) -> None:
        """Add ``rho * V'`` (V' of one prior, K x d) to the classification
        layers' weights and leave nothing to calibrate (the plain head's
        cost)."""
        raise NotImplementedError

    def cached_losses(self, head: nn.Module, batch_inputs: Dict[str, Tensor],
                      batch_data_samples, cali_vectors: Tensor, priors: Tensor,
                      train_cls: bool) -> Dict[str, Tensor]:
        """The calibrator's losses on a cached batch of this kind.

        Args:
            head (nn.Module): the calibrated head.
            batch_inputs (dict): ``hidden_states`` (L, B, Q, d),
                ``bbox_preds`` and, with targets, ``targets`` (B, Q, 4).
            batch_data_samples (list[DetDataSample]): the data samples.
            cali_vectors (Tensor): V' of ``priors``.
            priors (Tensor): the priors, (B, K, K) or (K, K).
            train_cls (bool): let gradients reach the classification
                layers.

        Returns:
            dict[str, Tensor]: the losses.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.name!r})'


def kind_of_head(head: Optional[nn.Module]) -> Optional[HeadKind]:
    """The adapter a calibrated head declares (``head_kind``), or
    ``None`` for a plain head."""
    return HEAD_KINDS.get(getattr(type(head), 'head_kind', None) or '')


def classifying_head_of(model: nn.Module) -> Optional[nn.Module]:
    """The detector's calibrated head where it has one (``calibrated_head``
    of a CaliDet detector), else ``None``."""
    try:
        return getattr(model, 'calibrated_head', None)
    except AttributeError:  # a property of a half-built detector
        return None


def find_head_kind(model: nn.Module) -> Optional[HeadKind]:
    """:func:`head_kind_of`, ``None`` for a model of no known kind."""
    kind = kind_of_head(classifying_head_of(model))
    if kind is not None:
        return kind
    return next((k for k in HEAD_KINDS.values() if k.claims(model)), None)


def head_kind_of(model: nn.Module) -> HeadKind:
    """The adapter of a detector's head kind: the one its calibrated head
    declares, else the first that claims the (plain) detector.

    Args:
        model (nn.Module): a detector, CaliDet or plain.

    Returns:
        HeadKind: the adapter.

    Raises:
        TypeError: no registered kind has the detector's head.
    """
    kind = find_head_kind(model)
    if kind is None:
        raise TypeError(
            f'{type(model).__name__} has no head of a known kind ('
            f'{", ".join(HEAD_KINDS)}: a DETR, one-stage or two-stage '
            'detector)')
    return kind
