# Copyright (c) mmcalidet contributors. All rights reserved.
"""Checks every calibratable detector's tests run alike: it trains its
CaliFormer on the EdgeSampler's priors; a bad prior is refused and the last
one kept; ``inference_detector`` takes a prior per call and per image."""
from typing import Collection, Sequence

import numpy as np
import torch

from ._utils import data_root, demo_batch, random_prior

#: two real coco-mini val images
IMAGES = ('000000000139.jpg', '000000000802.jpg')


def check_califormer_trains(model: torch.nn.Module,
                            labels: Sequence[Sequence[int]],
                            loss_keys: Collection[str]) -> None:
    """A training step on a demo batch: every image gets a K x K prior
    from the EdgeSampler, the losses hold ``loss_keys`` (LoMa among them)
    and are finite, and the CaliFormer gets gradients.

    Args:
        model (nn.Module): a calibratable detector.
        labels (Sequence[Sequence[int]]): the demo batch's classes.
        loss_keys (Collection[str]): losses that must be there.
    """
    model.train()
    k = model.num_classes
    data = model.data_preprocessor(demo_batch(labels, size=64), True)
    assert all(ds.prior.shape == (k, k) for ds in data['data_samples'])
    model.zero_grad()
    losses = model.loss(data['inputs'], data['data_samples'])
    assert set(loss_keys) <= set(losses), sorted(losses)
    total, _ = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    grads = [p.grad for p in model.calibrated_head.califormer.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad()


def check_bad_priors_refused(model: torch.nn.Module) -> None:
    """A prior of the wrong K, with NaN, or outside [0, 1] raises a
    ``ValueError`` naming the problem, and the model keeps its prior.

    Args:
        model (nn.Module): a calibratable detector with K = 80.
    """
    import pytest
    model.set_prior(random_prior(7))
    before = model.get_prior()
    bad = random_prior(8)
    bad[3, 4] = np.nan
    for prior, match in ((random_prior(0, num_classes=3), '80'),
                         (bad, 'NaN|finite'), (random_prior(8) * 2,
                                               r'\[0, 1\]|range')):
        with pytest.raises(ValueError, match=match):
            model.set_prior(prior)
        np.testing.assert_array_equal(model.get_prior(), before)
    model.set_prior(None)


def check_inference_priors(model: torch.nn.Module) -> None:
    """``inference_detector(prior=...)`` on two real images: a call's
    prior applies to that call only and equals the same deployed prior;
    per-image priors give each image its own.

    Args:
        model (nn.Module): a calibratable detector whose scores depend on
            the prior (V' not 0) and that detects something.
    """
    import mmcv

    from mmcalidet.apis import inference_detector
    from mmcalidet.priors import flat_prior
    model.eval()
    images = [
        mmcv.imread(f'{data_root()}/coco-mini/images/val2017/{name}')
        for name in IMAGES
    ]
    model.set_prior(None)
    plain = inference_detector(model, images)
    assert len(plain[0].pred_instances) > 0
    site = random_prior(11)
    called = inference_detector(model, images, prior=site)
    # the call's prior reaches the head; the model's own stays E0
    assert not torch.allclose(called[0].pred_instances.scores[:5],
                              plain[0].pred_instances.scores[:5])
    np.testing.assert_array_equal(model.get_prior(),
                                  flat_prior(model.num_classes))
    model.set_prior(site)
    deployed = inference_detector(model, images)
    model.set_prior(None)
    for a, b in zip(called, deployed):
        torch.testing.assert_close(a.pred_instances.scores,
                                   b.pred_instances.scores)
    # per image: E0 for the first, the site's for the second
    mixed = inference_detector(model, images, prior=[None, site])
    torch.testing.assert_close(mixed[0].pred_instances.scores,
                               plain[0].pred_instances.scores)
    torch.testing.assert_close(mixed[1].pred_instances.scores,
                               called[1].pred_instances.scores)
