# Copyright (c) mmcalidet contributors. All rights reserved.
"""A data preprocessor for images and for cached decoder outputs."""
from typing import Any, Dict

import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.registry import MODELS

from .edge_sampler import EdgeSampler

#: the keys of a batch of cached decoder outputs
CACHED_KEYS = ('hidden_states', 'bbox_preds')


def is_cached_batch(inputs: Any) -> bool:
    """Whether ``inputs`` are cached decoder outputs (a dict with
    ``hidden_states`` and ``bbox_preds``) rather than images."""
    return isinstance(inputs, dict) and all(k in inputs for k in CACHED_KEYS)


@MODELS.register_module()
class DecoderCachePreprocessor(DetDataPreprocessor):
    """mmdet's ``DetDataPreprocessor`` that also batches cached decoder
    outputs (:class:`~mmcalidet.datasets.DecoderCacheDataset`).

    Images go through ``DetDataPreprocessor`` unchanged, so a config with
    this preprocessor still tests, validates and runs inference on images.
    A batch of cached outputs is stacked to ``hidden_states`` (L, B, Q, d)
    and ``bbox_preds`` (L, B, Q, 4) on the model's device and, in training,
    passed through the ``EdgeSampler`` batch augment, which draws each
    sample's prior (the only batch augment that applies to cached outputs).

    Args:
        *args, **kwargs: the arguments of ``DetDataPreprocessor``.
    """

    def forward(self, data: dict, training: bool = False) -> Dict:
        """Batch images (``DetDataPreprocessor``) or cached outputs.

        Args:
            data (dict): ``dict(inputs=..., data_samples=[...])`` from the
                data loader.
            training (bool): draw the training priors (batch augments).

        Returns:
            dict: ``dict(inputs=..., data_samples=[...])``; for cached
            outputs ``inputs`` is ``dict(hidden_states=(L, B, Q, d),
            bbox_preds=(L, B, Q, 4))``, and ``targets`` (B, Q, 4) for a
            dense head's cached locations or a box head's cached RoIs.
        """
        if not is_cached_batch(data.get('inputs')):
            return super().forward(data, training)
        data = self.cast_data(data)
        inputs = data['inputs']
        hidden = torch.stack(list(inputs['hidden_states']), dim=1).float()
        boxes = torch.stack(list(inputs['bbox_preds']), dim=1).float()
        batch = dict(hidden_states=hidden, bbox_preds=boxes)
        if 'targets' in inputs:  # a dense head's locations, a box head's RoIs
            batch['targets'] = torch.stack(list(inputs['targets'])).float()
        samples = data['data_samples']
        if training and self.batch_augments is not None:
            for aug in self.batch_augments:
                if not isinstance(aug, EdgeSampler):
                    raise TypeError(
                        'cached decoder outputs take only the EdgeSampler '
                        f'batch augment, got {type(aug).__name__}')
                batch['hidden_states'], samples = aug(batch['hidden_states'],
                                                      samples)
        return dict(inputs=batch, data_samples=samples)
