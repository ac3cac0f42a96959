# Copyright (c) mmcalidet contributors. All rights reserved.
"""Multi-scale deformable attention on the CPU as one batched matrix
product, for the small feature maps of the tiny CPU configs.

mmcv's CPU path (``multi_scale_deformable_attn_pytorch``) samples every
point with ``grid_sample`` into a ``(bs * heads, dims, queries, levels *
points)`` tensor, then multiplies it by the attention weights and sums:
on the demo's DINO (4 images of 128 px: 340 keys, 8 heads, 4 levels x 4
points) that is the costliest part of a training iteration. Bilinear
sampling followed by the weighted sum is linear in the values, so per
batch element and head it is one sparse ``(queries, keys)`` matrix ``A``:
each sampling point adds its attention weight times its 4 bilinear corner
weights at its 4 corners' key indices. Where ``A`` is small (few keys, as
on 128-px images), it is built densely with ``scatter_add`` and applied by
``bmm``: the same sum in another order (float rounding aside), forward and
backward.

:func:`multi_scale_deformable_attn_cpu` takes this path where ``A`` has at
most :data:`DENSE_LIMIT` elements and the model is not being traced or
exported; otherwise it calls mmcv's own function. mmcv's
``MultiScaleDeformableAttention.forward`` calls its module's function on
the CPU; :func:`use_dense_deform_attn` points that name at this one (a
config opts in by importing :mod:`mmcalidet.models.layers.
enable_dense_deform_attn` through ``custom_imports``, as the tiny CPU
configs do). CUDA runs take mmcv's CUDA kernel either way.
"""
from contextlib import contextmanager
from typing import Iterator, Sequence, Union

import torch
from mmcv.ops import multi_scale_deform_attn as mmcv_msda
from torch import Tensor

#: mmcv's own CPU function, kept before any switch
MMCV_CPU_FUNCTION = mmcv_msda.multi_scale_deformable_attn_pytorch

#: the largest dense matrix ``bs * heads * queries * keys`` built (float
#: elements; 2 ** 24 is 64 MiB in float32): the demo's encoder needs 3.7 M
DENSE_LIMIT = 2**24


def dense_multi_scale_deformable_attn(value: Tensor,
                                      value_spatial_shapes: Union[Tensor,
                                                                  Sequence],
                                      sampling_locations: Tensor,
                                      attention_weights: Tensor) -> Tensor:
    """Multi-scale deformable attention as ``A @ value`` per batch element
    and head, with ``A`` dense (mmcv's bilinear sampling with zero padding,
    ``align_corners=False``).

    Args:
        value (Tensor): ``(bs, num_keys, num_heads, dims)``.
        value_spatial_shapes (Tensor | Sequence): ``(num_levels, 2)``, the
            ``(h, w)`` of each level, whose keys follow each other in
            ``value``.
        sampling_locations (Tensor): ``(bs, num_queries, num_heads,
            num_levels, num_points, 2)``, ``(x, y)`` in [0, 1] of each level
            (outside it samples zeros).
        attention_weights (Tensor): ``(bs, num_queries, num_heads,
            num_levels, num_points)``.

    Returns:
        Tensor: ``(bs, num_queries, num_heads * dims)``, as mmcv's function.
    """
    bs, num_keys, num_heads, dims = value.shape
    _, num_queries, _, num_levels, num_points, _ = sampling_locations.shape
    shapes = torch.as_tensor(
        value_spatial_shapes, dtype=torch.long, device=value.device)
    sizes = shapes[:, 0] * shapes[:, 1]
    if int(sizes.sum()) != num_keys:
        raise ValueError(f'value_spatial_shapes cover {int(sizes.sum())} '
                         f'keys, value has {num_keys}')
    # (bs, heads, queries, levels, points[, 2])
    locations = sampling_locations.permute(0, 2, 1, 3, 4, 5)
    weights = attention_weights.permute(0, 2, 1, 3, 4)
    height = shapes[:, 0].view(num_levels, 1)
    width = shapes[:, 1].view(num_levels, 1)
    start = (sizes.cumsum(0) - sizes).view(num_levels, 1)
    # pixel coordinates of align_corners=False
    x = locations[..., 0] * width.to(locations.dtype) - 0.5
    y = locations[..., 1] * height.to(locations.dtype) - 0.5
    x0, y0 = x.floor(), y.floor()
    fx, fy = x - x0, y - y0
    x0, y0 = x0.long(), y0.long()
    indices, entries = [], []
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            xc, yc = x0 + dx, y0 + dy
            inside = (xc >= 0) & (xc < width) & (yc >= 0) & (yc < height)
            index = start + yc.clamp(min=0) * width + xc.clamp(min=0)
            indices.append(torch.where(inside, index, 0))
            entries.append(weights * wx * wy * inside)
    index = torch.stack(indices, -1).reshape(bs * num_heads, num_queries, -1)
    entry = torch.stack(entries, -1).reshape(bs * num_heads, num_queries, -1)
    matrix = entry.new_zeros(bs * num_heads, num_queries,
                             num_keys).scatter_add_(2, index, entry)
    keys = value.permute(0, 2, 1, 3).reshape(bs * num_heads, num_keys, dims)
    output = torch.bmm(matrix, keys).view(bs, num_heads, num_queries, dims)
    return output.permute(0, 2, 1, 3).reshape(bs, num_queries,
                                              num_heads * dims)


def multi_scale_deformable_attn_cpu(value: Tensor,
                                    value_spatial_shapes: Union[Tensor,
                                                                Sequence],
                                    sampling_locations: Tensor,
                                    attention_weights: Tensor) -> Tensor:
    """mmcv's ``multi_scale_deformable_attn_pytorch``, computed densely
    (:func:`dense_multi_scale_deformable_attn`) where the matrix is small
    and the model is not traced or exported, else by mmcv.

    Args and Returns: as :func:`dense_multi_scale_deformable_attn`.
    """
    bs, num_keys, num_heads, _ = value.shape
    num_queries = sampling_locations.shape[1]
    if bs * num_heads * num_queries * num_keys > DENSE_LIMIT or \
            torch.jit.is_tracing() or torch.jit.is_scripting() or \
            torch.onnx.is_in_onnx_export():
        return MMCV_CPU_FUNCTION(value, value_spatial_shapes,
                                 sampling_locations, attention_weights)
    return dense_multi_scale_deformable_attn(value, value_spatial_shapes,
                                             sampling_locations,
                                             attention_weights)


def use_dense_deform_attn(enabled: bool = True) -> bool:
    """Make mmcv's ``MultiScaleDeformableAttention`` compute its CPU path
    with :func:`multi_scale_deformable_attn_cpu` (or, ``enabled=False``,
    with mmcv's own function again), for every such module of the process.

    Args:
        enabled (bool): whether to use the dense path.

    Returns:
        bool: whether it was in use before.
    """
    before = mmcv_msda.multi_scale_deformable_attn_pytorch is \
        multi_scale_deformable_attn_cpu
    mmcv_msda.multi_scale_deformable_attn_pytorch = (
        multi_scale_deformable_attn_cpu if enabled else MMCV_CPU_FUNCTION)
    return before


@contextmanager
def dense_deform_attn(enabled: bool = True) -> Iterator[None]:
    """:func:`use_dense_deform_attn` for a block, restoring the setting
    before it on exit.

    Args:
        enabled (bool): whether the block uses the dense path.
    """
    before = use_dense_deform_attn(enabled)
    try:
        yield
    finally:
        use_dense_deform_attn(before)
