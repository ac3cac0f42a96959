# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tiny two-stage detectors with a narrower box head, for the tests
whose cost is the model's size (ONNX exports and ONNX Runtime sessions)."""
import torch

from ._utils import build_detector, get_config

#: the box head's FC width: 256, not the config's 1,024 (the tiny Faster
#: R-CNN's 34 M parameters become 18 M, its graph 58 MB instead of 117 MB;
#: an export and its check of one image took 3.1 s instead of 5.1 s on a
#: 2-core AMD EPYC VM, 2026-12-08); the graph holds the same operators
NARROW_FC = 256
#: the same as a ``--cfg-options`` entry of a tool
NARROW_OPTION = f'model.roi_head.bbox_head.fc_out_channels={NARROW_FC}'


def build_narrow_two_stage(name: str, seed: int = 0) -> torch.nn.Module:
    """:func:`testing.build_detector` of a two-stage config with its box
    head :data:`NARROW_FC` wide.

    Args:
        name (str): config path relative to ``configs/``.
        seed (int): torch seed of the initialisation.

    Returns:
        nn.Module: the detector, in training mode.
    """
    roi_head = get_config(name).model.roi_head
    return build_detector(
        name,
        seed=seed,
        roi_head=dict(
            roi_head,
            bbox_head=dict(roi_head.bbox_head, fc_out_channels=NARROW_FC)))
