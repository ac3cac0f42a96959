# Copyright (c) mmcalidet contributors. All rights reserved.
"""One adapter per head kind (:mod:`.base`): ``'decoder'`` (a DETR's
decoder head, :mod:`.decoder`), ``'dense'`` (a one-stage head,
:mod:`.dense`, with its families :mod:`.rtmdet` and :mod:`.fcos`) and
``'roi'`` (a two-stage box head, :mod:`.roi`). Only the adapters and the
heads name mmdet's head internals."""
from .base import (HEAD_KINDS, HeadKind, find_head_kind, head_kind_of,
                   kind_of_head, load_part, register_head_kind)
from .decoder import DECODER, DecoderKind, cached_head_losses
from .dense import (DENSE, DENSE_FAMILIES, DenseFamily, DenseKind,
                    register_dense_family)
from .fcos import FCOS_FAMILY, FCOSFamily
from .roi import ROI, RoIKind
from .rtmdet import RTMDET_FAMILY, RTMDetFamily

__all__ = [
    'HEAD_KINDS', 'HeadKind', 'head_kind_of', 'find_head_kind', 'kind_of_head',
    'load_part', 'register_head_kind', 'DECODER', 'DecoderKind',
    'cached_head_losses', 'DENSE', 'DenseKind', 'DenseFamily',
    'DENSE_FAMILIES', 'register_dense_family', 'RTMDET_FAMILY', 'RTMDetFamily',
    'FCOS_FAMILY', 'FCOSFamily', 'ROI', 'RoIKind'
]
