# Copyright (c) mmcalidet contributors. All rights reserved.
import collections
import io
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

import mmcalidet  # noqa: F401  (registers the safe globals)
from mmcalidet.utils.checkpoint import history_buffer_getattr


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)  # torch's default: weights_only=True


def test_mmengine_checkpoint_objects_load_with_weights_only():
    hub = MessageHub('test_checkpoint_hub')
    for value in (1.0, 2.0, 4.5):
        hub.update_scalar('train/loss', value)
    hub.update_info('iter', 3)
    loaded = roundtrip(
        dict(
            message_hub=hub.state_dict(),
            meta=dict(
                seed=np.int64(3), scale=np.float32(0.5), hist=np.arange(3.0)),
            state_dict=collections.OrderedDict(w=torch.ones(2))))
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer)
    assert buffer.mean() == pytest.approx(7.5 / 3)
    assert buffer.statistics('max') == 4.5
    assert loaded['meta']['seed'] == 3
    np.testing.assert_array_equal(loaded['meta']['hist'], np.arange(3.0))


class _Sneaky:
    """Pickles as getattr(OrderedDict, 'fromkeys')(...)-style lookups."""

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)


@pytest.mark.parametrize('target,name', [
    (collections.OrderedDict, 'fromkeys'),
    (HistoryBuffer, '__init__'),
    (HistoryBuffer, '_set_default_statistics'),
])
def test_other_getattr_lookups_are_refused(target, name):
    with pytest.raises(pickle.UnpicklingError, match='only the statistics'):
        roundtrip(dict(x=_Sneaky(target, name)))


def test_guarded_getattr():
    assert history_buffer_getattr(HistoryBuffer, 'mean') is \
        vars(HistoryBuffer)['mean']
    with pytest.raises(pickle.UnpicklingError):
        history_buffer_getattr(HistoryBuffer, 'max_length')
    with pytest.raises(pickle.UnpicklingError):
        history_buffer_getattr(np, 'load')
