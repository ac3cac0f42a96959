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
backward. The backward pass is written out
(:class:`DenseDeformAttnFunction`, checked by ``gradcheck``): autograd
through the corner arithmetic cost about a quarter of its time.

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
from typing import Iterator, Sequence, Tuple, Union

import torch
from mmcv.ops import multi_scale_deform_attn as mmcv_msda
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

#: mmcv's own CPU function, kept before any switch
MMCV_CPU_FUNCTION = mmcv_msda.multi_scale_deformable_attn_pytorch

#: the largest dense matrix ``bs * heads * queries * keys`` built (float
#: elements; 2 ** 24 is 64 MiB in float32): the demo's encoder needs 3.7 M
DENSE_LIMIT = 2**24


def bilinear_entries(shapes: Tensor, sampling_locations: Tensor,
                     attention_weights: Tensor) -> Tuple[Tensor, ...]:
    """Each sampling point's 4 bilinear corners: their key indices and
    entries (attention weight x corner weight) in the dense matrix, and
    the factors the backward pass needs.

    Every tensor is laid out queries last, ``(..., bs, heads, levels,
    points, queries)``, so that each element-wise op runs along the queries
    (small trailing dimensions make PyTorch's CPU loops several times
    slower).

    Args:
        shapes (Tensor): ``(num_levels, 2)`` long, the ``(h, w)`` of each
            level.
        sampling_locations (Tensor): as in
            :func:`dense_multi_scale_deformable_attn`.
        attention_weights (Tensor): as in
            :func:`dense_multi_scale_deformable_attn`.

    Returns:
        tuple[Tensor]: ``index`` and ``entry``, ``(2 (y), 2 (x), bs, heads,
        levels, points, queries)``, each corner's key index within its batch
        element and head and its entry; ``corner_weight``, ``(2 (x, y), 2
        (corner), ...)``, the corner weights (zero outside the level);
        ``signed``, the same shape, their derivative with respect to the
        pixel coordinate; ``attention``, the attention weights queries last;
        and ``extent``, each level's ``(w, h)`` as ``(2, 1, 1, levels, 1,
        1)``.
    """
    dtype, device = sampling_locations.dtype, sampling_locations.device
    num_levels = shapes.shape[0]
    locations = sampling_locations.permute(5, 0, 2, 3, 4, 1).contiguous()
    attention = attention_weights.permute(0, 2, 3, 4, 1).contiguous()
    extent = shapes.flip(1).t().reshape(2, 1, 1, num_levels, 1, 1)
    # pixel coordinates of align_corners=False
    pixel = locations * extent.to(dtype) - 0.5
    corner = pixel.floor()
    frac = pixel - corner
    corner = corner.long().unsqueeze(1) + torch.arange(
        2, device=device).view(1, 2, 1, 1, 1, 1, 1)
    limit = extent.unsqueeze(1)
    inside = ((corner >= 0) & (corner < limit)).to(dtype)
    corner_weight = torch.stack([1 - frac, frac], 1) * inside
    sign = torch.tensor([-1.0, 1.0], dtype=dtype,
                        device=device).view(1, 2, 1, 1, 1, 1, 1)
    attended_y = corner_weight[1] * attention
    entry = attended_y.unsqueeze(1) * corner_weight[0].unsqueeze(0)
    sizes = shapes[:, 0] * shapes[:, 1]
    row = (sizes.cumsum(0) - sizes).view(num_levels, 1, 1) + \
        corner[1] * shapes[:, 1].view(num_levels, 1, 1)
    # a corner outside its level has entry 0: its index only has to be a
    # valid key (of any level)
    last_key = int(sizes.sum()) - 1
    index = (row.unsqueeze(1) + corner[0].unsqueeze(0)).clamp_(0, last_key)
    return index, entry, corner_weight, inside * sign, attention, extent


class DenseDeformAttnFunction(Function):
    """``A @ value`` per batch element and head, with the backward pass
    written out: autograd through the corner arithmetic of
    :func:`bilinear_entries` would add a dozen element-wise ops per
    sampling point tensor.

    The matrix ``A`` is kept transposed, ``(bs * heads * keys, queries)``,
    and filled by one ``scatter_add`` along its rows. Under CPU autocast it
    runs in float32 (its backward's products would otherwise mix dtypes).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type='cpu', cast_inputs=torch.float32)
    def forward(ctx, value: Tensor, shapes: Tensor, sampling_locations: Tensor,
                attention_weights: Tensor) -> Tensor:
        bs, num_keys, num_heads, dims = value.shape
        num_queries = sampling_locations.shape[1]
        # factors: corner_weight, signed, attention, extent
        index, entry, *factors = bilinear_entries(shapes, sampling_locations,
                                                  attention_weights)
        offset = torch.arange(bs * num_heads, device=value.device) * num_keys
        index = (index + offset.view(bs, num_heads, 1, 1, 1)).view(
            -1, num_queries)
        matrix = entry.new_zeros(bs * num_heads * num_keys,
                                 num_queries).scatter_add_(
                                     0, index, entry.view(-1, num_queries))
        keys = value.permute(0, 2, 1, 3).reshape(bs * num_heads, num_keys,
                                                 dims)
        matrix_t = matrix.view(bs * num_heads, num_keys, num_queries)
        output = torch.bmm(matrix_t.transpose(1, 2), keys)
        ctx.save_for_backward(keys, matrix_t, index, *factors)
        output = output.view(bs, num_heads, num_queries, dims)
        return output.transpose(1, 2).reshape(bs, num_queries, -1)

    @staticmethod
    @once_differentiable
    @torch.amp.custom_bwd(device_type='cpu')
    def backward(ctx, grad_output: Tensor) -> tuple:
        keys, matrix_t, index, corner_weight, signed, attention, extent = \
            ctx.saved_tensors
        bs_heads, num_keys, dims = keys.shape
        bs, num_queries = grad_output.shape[:2]
        grad = grad_output.reshape(bs, num_queries, -1, dims)
        grad = grad.transpose(1, 2).reshape(bs_heads, num_queries, dims)
        grad_value = grad_locations = grad_weights = None
        if ctx.needs_input_grad[0]:
            grad_value = torch.bmm(matrix_t, grad)
            grad_value = grad_value.view(bs, -1, num_keys,
                                         dims).transpose(1, 2)
        if not (ctx.needs_input_grad[2] or ctx.needs_input_grad[3]):
            return grad_value, None, None, None
        grad_entry = torch.bmm(keys, grad.transpose(1, 2)).view(
            -1, num_queries).gather(0, index).view(2, 2, *attention.shape)
        # entry[y, x] = attention * weight_y[y] * weight_x[x]
        along_x = (grad_entry * corner_weight[0].unsqueeze(0)).sum(1)
        if ctx.needs_input_grad[3]:
            grad_weights = (along_x * corner_weight[1]).sum(0).permute(
                0, 4, 1, 2, 3)
        if ctx.needs_input_grad[2]:
            grad_y = (along_x * signed[1]).sum(0) * attention
            along_y = (grad_entry *
                       (corner_weight[1] * attention).unsqueeze(1)).sum(0)
            grad_x = (along_y * signed[0]).sum(0)
            grad_locations = (torch.stack([grad_x, grad_y]) *
                              extent.to(grad_x.dtype)).permute(
                                  1, 5, 2, 3, 4, 0)
        return grad_value, None, grad_locations, grad_weights


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
    num_keys = value.shape[1]
    shapes = torch.as_tensor(
        value_spatial_shapes, dtype=torch.long, device=value.device)
    covered = int((shapes[:, 0] * shapes[:, 1]).sum())
    if covered != num_keys:
        raise ValueError(f'value_spatial_shapes cover {covered} '
                         f'keys, value has {num_keys}')
    return DenseDeformAttnFunction.apply(value, shapes, sampling_locations,
                                         attention_weights)


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
