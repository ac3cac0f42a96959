# Copyright (c) mmcalidet contributors. All rights reserved.
"""Cached backbone and neck features of a one- or two-stage detector.

A one- or two-stage CaliDet detector's prior only reaches its heads' class
scores; what ``extract_feat`` gives (the backbone and the neck) does not
depend on it. :class:`FeatureCache` keeps those features per image, in
memory, so that :class:`~mmcalidet.evaluation.HeadRescorer` re-runs only
the heads under each prior. It reads like a
:class:`~mmcalidet.decoder_cache.DecoderCache` where the evaluation reads
one (``len``, ``get``, ``data_samples``, ``gt_label_lists``, ``img_ids``,
``batch_ids``).

An image's features are kept at the size its batch was padded to, so
re-scoring an image gives what ``model.predict`` gives on its batch;
images are re-batched only with images of the same feature sizes
(:meth:`FeatureCache.batches`). They take memory: ``nbytes`` says how much
(RTMDet-tiny at 640 x 640: about 3 MB an image).
"""
import contextlib
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.structures import DetDataSample
from torch import Tensor

from ..decoder_cache.samples import gt_arrays, strip_data_sample
from ..utils.progress import progress_bar

#: a batch: ``dict(inputs=[...], data_samples=[...])`` as a data loader
#: yields it, or the pair ``(inputs, data_samples)``
Batch = Union[dict, Tuple[Sequence, Sequence]]


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model in eval mode (as ``test_step`` runs it) inside the block,
    its previous mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _as_batch(batch: Batch) -> dict:
    """A batch as the data preprocessor takes it."""
    if isinstance(batch, dict):
        if 'inputs' not in batch or 'data_samples' not in batch:
            raise ValueError('a batch dict needs inputs and data_samples, '
                             f'got keys {sorted(batch)}')
        return dict(inputs=batch['inputs'], data_samples=batch['data_samples'])
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return dict(inputs=batch[0], data_samples=batch[1])
    raise TypeError('a batch is dict(inputs=..., data_samples=...) or '
                    f'(inputs, data_samples), got {type(batch).__name__}')


class FeatureCache:
    """Per-image ``extract_feat`` outputs of a detector with the images'
    data samples (metainfo and ground truth), in memory.

    Args:
        feats (list[tuple[Tensor]]): per image, the levels' features
            (C, H, W) each.
        data_samples (list[DetDataSample]): per image, its metainfo and
            ground truth (no predictions).
        batch_ids (Sequence[int]): the data-loader batch of each image (the
            E_b batches of the evaluation).
        classes (Sequence[str], optional): the detector's class names.
    """

    def __init__(self,
                 feats: List[Tuple[Tensor, ...]],
                 data_samples: List[DetDataSample],
                 batch_ids: Sequence[int],
                 classes: Optional[Sequence[str]] = None) -> None:
        if not (len(feats) == len(data_samples) == len(batch_ids)):
            raise ValueError(
                f'{len(feats)} images of features, {len(data_samples)} '
                f'data samples and {len(batch_ids)} batch ids disagree')
        levels = {len(f) for f in feats}
        if len(levels) > 1:
            raise ValueError(f'the images have {sorted(levels)} feature '
                             'levels: one detector gives one number')
        self.feats = [tuple(feat) for feat in feats]
        self.data_samples = list(data_samples)
        #: the data-loader batch of each image (the E_b batches)
        self.batch_ids: List[int] = [int(b) for b in batch_ids]
        self.classes = tuple(classes) if classes else None
        #: a :class:`DecoderCache`'s: an in-memory cache has no folder
        self.folder: Optional[str] = None
        self.reused = False

    @classmethod
    def from_batches(cls,
                     model: torch.nn.Module,
                     batches: Iterable[Batch],
                     progress: bool = False,
                     total: Optional[int] = None) -> 'FeatureCache':
        """Run the detector's data preprocessor (test mode) and
        ``extract_feat`` once over batches, in eval mode without
        gradients, and keep every image's features.

        Args:
            model (nn.Module): the detector (``extract_feat`` and a
                ``data_preprocessor``).
            batches (Iterable): a data loader, or batches
                ``dict(inputs=..., data_samples=...)`` or
                ``(inputs, data_samples)``.
            progress (bool): show a progress bar.
            total (int, optional): the number of batches, for the bar.

        Returns:
            FeatureCache: the images in the order given.

        Raises:
            ValueError: no image, or a non-finite feature (the image is
                named).
        """
        if not hasattr(model, 'extract_feat'):
            raise TypeError(f'{type(model).__name__} has no extract_feat')
        feats, samples, batch_ids = [], [], []
        with evaluating(model), torch.no_grad(), progress_bar(
                desc='feature cache', enabled=progress, total=total) as bar:
            for batch_id, batch in enumerate(batches):
                data = model.data_preprocessor(_as_batch(batch), False)
                levels = model.extract_feat(data['inputs'])
                for i, sample in enumerate(data['data_samples']):
                    image = tuple(x[i].detach().cpu().clone() for x in levels)
                    if not all(bool(torch.isfinite(x).all()) for x in image):
                        raise ValueError(
                            f'the features of image {len(samples)} (img_id '
                            f'{sample.metainfo.get("img_id")}) are not '
                            'finite')
                    feats.append(image)
                    samples.append(strip_data_sample(sample))
                    batch_ids.append(batch_id)
                bar.update(1)
        if not feats:
            raise ValueError('no image to cache: the batches were empty')
        meta = getattr(model, 'dataset_meta', None) or {}
        return cls(feats, samples, batch_ids, meta.get('classes'))

    def __len__(self) -> int:
        return len(self.feats)

    @property
    def bytes_per_image(self) -> int:
        """Mean bytes of features per image."""
        return self.nbytes // max(1, len(self))

    @property
    def nbytes(self) -> int:
        """Bytes of the features of all images."""
        return sum(x.numel() * x.element_size() for f in self.feats for x in f)

    def _indices(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = idx[(idx < 0) | (idx >= len(self))]
        if len(bad):
            raise IndexError(f'image {int(bad[0])} is not among the '
                             f'{len(self)} cached images')
        return idx

    def shape_of(self, index: int) -> Tuple[Tuple[int, ...], ...]:
        """The feature shapes of an image, one per level."""
        return tuple(tuple(x.shape) for x in self.feats[index])

    def batches(self, indices: Sequence[int],
                batch_size: int) -> List[np.ndarray]:
        """Positions in ``indices`` grouped into batches :meth:`get` can
        stack: images of the same feature sizes, at most ``batch_size``,
        each group in the order given.

        Args:
            indices (Sequence[int]): image indices.
            batch_size (int): images per batch (>= 1).

        Returns:
            list[np.ndarray]: positions into ``indices``.
        """
        if int(batch_size) < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        groups = {}
        for pos, k in enumerate(self._indices(indices)):
            groups.setdefault(self.shape_of(int(k)), []).append(pos)
        return [
            np.asarray(group[start:start + int(batch_size)], dtype=np.int64)
            for group in groups.values()
            for start in range(0, len(group), int(batch_size))
        ]

    def get(
        self,
        indices: Sequence[int],
        device: Union[str, torch.device] = 'cpu'
    ) -> Tuple[Tuple[Tensor, ...], List[DetDataSample]]:
        """The features of some images, stacked per level, and their data
        samples.

        Args:
            indices (Sequence[int]): image indices of the same feature
                sizes (:meth:`batches` groups them).
            device (str | torch.device): where to put the features.

        Returns:
            tuple: the levels' (B, C, H, W) features and the data samples.

        Raises:
            ValueError: images of different feature sizes.
        """
        idx = self._indices(indices)
        if not len(idx):
            raise ValueError('no image asked for')
        shapes = {self.shape_of(int(k)) for k in idx}
        if len(shapes) > 1:
            raise ValueError(
                f'images {idx.tolist()} have {len(shapes)} different feature '
                'sizes (their batches were padded differently): group them '
                'with FeatureCache.batches')
        feats = tuple(
            torch.stack([self.feats[int(k)][level] for k in idx]).to(device)
            for level in range(len(self.feats[int(idx[0])])))
        return feats, [self.data_samples[int(k)] for k in idx]

    def gt_label_lists(self) -> List[np.ndarray]:
        """Per-image ground-truth class indices (int64)."""
        return [gt_arrays(s)[1] for s in self.data_samples]

    def img_ids(self) -> List:
        """The ``img_id`` of every image (``None`` where unknown)."""
        return [s.metainfo.get('img_id') for s in self.data_samples]
