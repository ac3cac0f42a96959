# Copyright (c) mmcalidet contributors. All rights reserved.
"""The CaliDet families a calibrator trains on a cache of (a dense or a
RoI head's), as the cached-calibration contract tests read them: their
configs, what their caches hold, the names of their calibrated parts, and
how to make a small cache of demo images."""
from types import SimpleNamespace
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from ._utils import demo_batch

#: the demo images' ground-truth labels, one tuple per image
LABELS = ((1, 2), (3, ), (0, 5, 7))

#: per family: ``config`` (the calibrator's), ``parent`` (the CaliDet
#: model it calibrates), ``baseline`` (what the cache is made from),
#: ``kind`` (the cache's ``meta['head']``), ``head`` (the calibrated
#: head's name in the detector), ``cls`` (its classification layer(s),
#: trained with ``cache_train_cls_branches``), ``cls_modules`` (their
#: names in ``calibrator_modules()``), ``num_levels`` (the cache's),
#: ``num_locations`` (the config's per image), ``loss_keys`` (the cached
#: loss's); a dense head's ``all_locations`` (a 64 px image's),
#: ``kernel`` (its classification conv's), ``plain_head`` (the baseline's
#: mmdet head class) and ``logits_tol`` (of its logits against the cache's)
FAMILIES: Dict[str, SimpleNamespace] = dict(
    rtmdet=SimpleNamespace(
        config='calidet/calidet_rtmdet_tiny_coco-mini_cached.py',
        parent='calidet/calidet_rtmdet_tiny_coco-mini.py',
        baseline='calidet/rtmdet_tiny_coco-mini.py',
        detector='CaliRTMDet',
        kind='dense',
        head='bbox_head',
        cls='rtm_cls',
        cls_modules=('rtm_cls.0', 'rtm_cls.1', 'rtm_cls.2'),
        num_levels=3,
        num_locations=512,
        loss_keys=('loss_cls', 'loss_loma'),
        # 8 x 8 + 4 x 4 + 2 x 2 locations
        all_locations=84,
        kernel=1,
        plain_head='RTMDetSepBNHead',
        logits_tol=dict()),
    fcos=SimpleNamespace(
        config='calidet/calidet_fcos_tiny_coco-mini_cached.py',
        parent='calidet/calidet_fcos_tiny_coco-mini.py',
        baseline='calidet/fcos_tiny_coco-mini.py',
        detector='CaliFCOS',
        kind='dense',
        head='bbox_head',
        cls='conv_cls',
        cls_modules=('conv_cls', ),
        num_levels=5,
        num_locations=512,
        loss_keys=('loss_cls', 'loss_loma'),
        # 8 x 8 + 4 x 4 + 2 x 2 + 1 + 1 locations
        all_locations=86,
        # each location's feature: the conv's input over its 3 x 3 kernel
        kernel=3,
        plain_head='FCOSHead',
        logits_tol=dict(atol=1e-5, rtol=1e-5)),
    faster_rcnn=SimpleNamespace(
        config='calidet/calidet_faster-rcnn_tiny_coco-mini_cached.py',
        parent='calidet/calidet_faster-rcnn_tiny_coco-mini.py',
        baseline='calidet/faster-rcnn_tiny_coco-mini.py',
        detector='CaliFasterRCNN',
        kind='roi',
        head='roi_head.bbox_head',
        cls='fc_cls',
        cls_modules=('fc_cls', ),
        num_levels=1,
        # the sampler's RoIs per image in the tiny configs
        num_locations=128,
        loss_keys=('loss_cls', 'acc', 'loss_loma')),
)


def calibrated_head(detector: nn.Module, family: SimpleNamespace):
    """The family's calibrated head of ``detector``."""
    return detector.get_submodule(family.head)


def small_cache(family: SimpleNamespace,
                detector: nn.Module,
                labels: Sequence[Sequence[int]] = LABELS,
                num_locations: Optional[int] = None,
                target: Optional[str] = None,
                seed: int = 0):
    """A cache of demo images of ``labels`` made from ``detector``: a
    dense head's (batches of 3 images, ``num_locations`` per image,
    default 40, the negatives drawn with ``seed``) or a box head's (one
    batch, the sampler's RoIs padded to ``num_locations``, the sampler
    seeded with ``seed``).

    Args:
        family (SimpleNamespace): one of :data:`FAMILIES`.
        detector (nn.Module): the detector the cache is made from.
        labels (sequence): ground-truth labels, one sequence per image.
        num_locations (int, optional): locations (RoIs) per image.
        target (str, optional): the cache's folder (in memory without).
        seed (int): the draw's seed.

    Returns:
        DecoderCache: the cache.
    """
    from mmcalidet.decoder_cache import (DecoderCacheWriter, fill_dense_cache,
                                         fill_roi_cache)
    writer = DecoderCacheWriter(target, fingerprint=dict(test=1))
    if family.kind == 'roi':
        torch.manual_seed(seed)
        return fill_roi_cache(
            detector, [demo_batch(labels, size=64)],
            writer,
            num_locations,
            progress=False)
    batches = [
        demo_batch(labels[s:s + 3], size=64, seed=s)
        for s in range(0, len(labels), 3)
    ]
    return fill_dense_cache(
        detector,
        batches,
        writer,
        40 if num_locations is None else num_locations,
        seed=seed,
        progress=False)


def batch_inputs(cache) -> Dict[str, torch.Tensor]:
    """A cache's whole content as one training batch's inputs: (L, B, Q,
    d) hidden states, (L, B, Q, 4) boxes, (B, Q, 4) targets."""
    return dict(
        hidden_states=torch.as_tensor(cache.hidden).transpose(0, 1),
        bbox_preds=torch.as_tensor(cache.boxes).transpose(0, 1),
        targets=torch.as_tensor(cache.targets))


def dataset_batch(cache) -> Dict:
    """The cache's images as the dataloader gives them to the
    preprocessor: per-image inputs in lists, new data samples."""
    items = [
        dict(
            inputs=dict(
                hidden_states=torch.as_tensor(cache.hidden[i]),
                bbox_preds=torch.as_tensor(cache.boxes[i]),
                targets=cache.targets_of(i)),
            data_samples=cache.data_sample(i)) for i in range(len(cache))
    ]
    return dict(
        inputs={
            k: [it['inputs'][k] for it in items]
            for k in ('hidden_states', 'bbox_preds', 'targets')
        },
        data_samples=[it['data_samples'] for it in items])


for _name, _family in FAMILIES.items():
    _family.name = _name
