# Copyright (c) mmcalidet contributors. All rights reserved.
"""Multi-scale deformable attention on the CPU by a compiled kernel, for
the tiny CPU configs.

mmcv's CPU path (``multi_scale_deformable_attn_pytorch``) samples every
point with ``grid_sample`` into a ``(bs * heads, dims, queries, levels *
points)`` tensor, then multiplies it by the attention weights and sums,
and autograd differentiates each of those ops: on the demo's DINO (4
images of 128 px: 340 keys, 8 heads, 4 levels x 4 points) that was the
costliest part of a training iteration. The Cython kernel
(``_deform_attn_kernel.pxi``) does the same sum in one pass over the sampling
points: each point's 4 bilinear corners (zero outside the level,
``align_corners=False``), weighted by the point's attention weight and
added to its query's output; its backward pass (:class:`
DeformAttnCPUFunction`, checked by ``gradcheck``) is one more pass. The
result is mmcv's, float rounding aside, and the same whatever the number
of threads. On x86-64 it is built twice, for the baseline CPU and with AVX2
and FMA; :data:`KERNEL` is the one this CPU runs.

:func:`multi_scale_deformable_attn_cpu` takes the kernel unless the model
is being traced or exported (mmcv's function then, which ONNX can record)
or the tensors are not float32 or float64 on the CPU. mmcv's
``MultiScaleDeformableAttention.forward`` calls its module's function on
the CPU; :func:`use_cpu_deform_attn` points that name at this one (a
config opts in by importing :mod:`mmcalidet.models.layers.
enable_cpu_deform_attn` through ``custom_imports``, as the tiny CPU
configs do). CUDA runs take mmcv's CUDA kernel either way.

What the kernel cannot compute it refuses with a one-line error, in
O(levels) a call: level shapes not ``(num_levels, 2)``, not of an integer
dtype (``TypeError``; mmcv's function takes no float shapes), not positive
or not covering the value's keys (:func:`_level_shapes`), and locations of
another number of levels. The compiled entries check again what they
index by (level shapes, level starts, the arrays' shapes), so that a
direct call never reads or writes outside an array either.
"""
from contextlib import contextmanager
from typing import Iterator, Sequence, Union

import torch
from mmcv.ops import multi_scale_deform_attn as mmcv_msda
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from . import _deform_attn_cpu

#: mmcv's own CPU function, kept before any switch
MMCV_CPU_FUNCTION = mmcv_msda.multi_scale_deformable_attn_pytorch


def _kernel_module():
    """The kernel compiled with AVX2 and FMA where torch finds them on
    this CPU (and the module was built: x86-64), else the baseline one."""
    if torch.backends.cpu.get_cpu_capability() in ('AVX2', 'AVX512'):
        try:
            from . import _deform_attn_cpu_avx2
            return _deform_attn_cpu_avx2
        except ImportError:
            pass
    return _deform_attn_cpu


#: the compiled kernel in use (:func:`_kernel_module`)
KERNEL = _kernel_module()

#: the dtypes the kernel computes in
KERNEL_DTYPES = (torch.float32, torch.float64)


def _num_threads() -> int:
    """torch's thread count, within what the kernel takes (it refuses a
    count outside [1, MAX_THREADS] with a ValueError)."""
    return max(
        1, min(torch.get_num_threads(), getattr(KERNEL, 'MAX_THREADS', 1024)))


def _array(tensor: Tensor):
    """A NumPy view of a contiguous CPU tensor (no copy)."""
    return tensor.detach().numpy()


class DeformAttnCPUFunction(Function):
    """Multi-scale deformable attention by the Cython kernel, forward and
    backward. Under CPU autocast it runs in float32, as mmcv's CUDA op."""

    @staticmethod
    @torch.amp.custom_fwd(device_type='cpu', cast_inputs=torch.float32)
    def forward(ctx, value: Tensor, shapes: Tensor, sampling_locations: Tensor,
                attention_weights: Tensor) -> Tensor:
        value = value.contiguous()
        locations = sampling_locations.contiguous()
        attention = attention_weights.contiguous()
        bs, _, num_heads, dims = value.shape
        num_queries = locations.shape[1]
        sizes = shapes[:, 0] * shapes[:, 1]
        starts = sizes.cumsum(0) - sizes
        output = value.new_zeros(bs, num_queries, num_heads, dims)
        KERNEL.deform_attn_forward(
            _array(value), _array(shapes), _array(starts), _array(locations),
            _array(attention), _array(output), _num_threads())
        ctx.save_for_backward(value, shapes, starts, locations, attention)
        return output.view(bs, num_queries, num_heads * dims)

    @staticmethod
    @once_differentiable
    @torch.amp.custom_bwd(device_type='cpu')
    def backward(ctx, grad_output: Tensor) -> tuple:
        value, shapes, starts, locations, attention = ctx.saved_tensors
        grad = grad_output.to(value.dtype).contiguous().view(
            *locations.shape[:3], value.shape[3])
        grad_value = torch.zeros_like(value)
        grad_locations = torch.empty_like(locations)
        grad_attention = torch.empty_like(attention)
        KERNEL.deform_attn_backward(
            _array(value), _array(shapes), _array(starts), _array(locations),
            _array(attention), _array(grad), _array(grad_value),
            _array(grad_locations), _array(grad_attention), _num_threads())
        needs = ctx.needs_input_grad
        return (grad_value if needs[0] else None, None,
                grad_locations if needs[2] else None,
                grad_attention if needs[3] else None)


def _level_shapes(value_spatial_shapes: Union[Tensor, Sequence],
                  num_keys: int) -> Tensor:
    """Check the level shapes against the keys, in O(levels), and give
    them as the kernel reads them.

    Refused: shapes not shaped ``(num_levels, 2)`` with at least one
    level, of a dtype other than an integer one (mmcv's function takes no
    float shapes, not even integral ones), with an ``h`` or ``w`` that is
    not positive, or whose ``h * w`` do not add up to ``num_keys`` (summed
    in Python's integers, so that huge shapes cannot wrap around int64
    to the right total). The kernel then never reads outside ``value``.

    Args:
        value_spatial_shapes (Tensor | Sequence): the ``(h, w)`` of each
            level, as :func:`deform_attn_cpu` takes them.
        num_keys (int): the keys of ``value`` (its dim 1).

    Returns:
        Tensor: ``(num_levels, 2)``, int64, contiguous, on the CPU.

    Raises:
        TypeError: shapes of a dtype that is not an integer one.
        ValueError: shapes that are not ``(num_levels, 2)`` integers within
            int64, not positive, or that do not cover ``num_keys`` keys.
    """
    shapes = value_spatial_shapes
    if not isinstance(shapes, Tensor):
        try:
            shapes = torch.as_tensor(shapes)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise ValueError('value_spatial_shapes must be (num_levels, 2) '
                             f'integers within int64: {err}') from None
    if shapes.dtype.is_floating_point or shapes.dtype.is_complex or \
            shapes.dtype == torch.bool:
        raise TypeError('value_spatial_shapes must be of an integer dtype '
                        "(mmcv's function takes no others); got "
                        f'{shapes.dtype}')
    if shapes.dim() != 2 or shapes.shape[1] != 2 or shapes.shape[0] == 0:
        raise ValueError('value_spatial_shapes must be (num_levels, 2), the '
                         '(h, w) of each level (num_levels >= 1); got shape '
                         f'{tuple(shapes.shape)}')
    covered = 0
    for level, (h, w) in enumerate(shapes.tolist()):
        if h <= 0 or w <= 0:
            raise ValueError('value_spatial_shapes must be positive; level '
                             f'{level} is ({h}, {w})')
        covered += h * w
    if covered != num_keys:
        raise ValueError(f'value_spatial_shapes cover {covered} '
                         f'keys, value has {num_keys}')
    return shapes.to('cpu', torch.long).contiguous()


def deform_attn_cpu(value: Tensor, value_spatial_shapes: Union[Tensor,
                                                               Sequence],
                    sampling_locations: Tensor,
                    attention_weights: Tensor) -> Tensor:
    """Multi-scale deformable attention by the Cython kernel (mmcv's
    bilinear sampling with zero padding, ``align_corners=False``).

    Args:
        value (Tensor): ``(bs, num_keys, num_heads, dims)``.
        value_spatial_shapes (Tensor | Sequence): ``(num_levels, 2)``, the
            ``(h, w)`` of each level, positive integers (of an integer
            dtype, as mmcv's function takes), whose keys follow each other
            in ``value`` and add up to its ``num_keys``.
        sampling_locations (Tensor): ``(bs, num_queries, num_heads,
            num_levels, num_points, 2)``, ``(x, y)`` in [0, 1] of each level
            (outside it samples zeros).
        attention_weights (Tensor): ``(bs, num_queries, num_heads,
            num_levels, num_points)``.

    Returns:
        Tensor: ``(bs, num_queries, num_heads * dims)``, as mmcv's function
        (which computes it where a location or weight is NaN or infinite:
        the output is NaN there, as mmcv's).

    Raises:
        ValueError: level shapes the kernel cannot compute
            (:func:`_level_shapes`: not ``(num_levels, 2)``, not positive,
            not covering the keys), locations of another number of levels,
            or a value, locations and weights of other shapes.
        TypeError: level shapes of a dtype that is not an integer one;
            tensors of several dtypes, or of one the kernel does not
            compute in (outside CPU autocast, which casts them).
    """
    if value.dim() != 4:
        raise ValueError('value must be (bs, num_keys, num_heads, dims); '
                         f'got {tuple(value.shape)}')
    bs, num_keys, num_heads, _ = value.shape
    shapes = _level_shapes(value_spatial_shapes, num_keys)
    num_levels = shapes.shape[0]
    if sampling_locations.dim() == 6 and \
            sampling_locations.shape[3] != num_levels:
        raise ValueError(
            f'sampling_locations must be of the {num_levels} levels of '
            'value_spatial_shapes (dim 3 of (bs, queries, heads, levels, '
            f'points, 2)); got {sampling_locations.shape[3]}')
    expected = (bs, sampling_locations.shape[1], num_heads, num_levels)
    if sampling_locations.dim() != 6 or sampling_locations.shape[-1] != 2 \
            or tuple(sampling_locations.shape[:4]) != expected \
            or attention_weights.shape != sampling_locations.shape[:5]:
        raise ValueError(
            'sampling_locations must be (bs, queries, heads, levels, points, '
            f'2) and attention_weights (bs, queries, heads, levels, points) '
            f'with (bs, heads, levels) = {(bs, num_heads, num_levels)}; '
            f'got {tuple(sampling_locations.shape)} and '
            f'{tuple(attention_weights.shape)}')
    tensors = (value, sampling_locations, attention_weights)
    if not _kernel_dtypes(*tensors):
        raise TypeError('the kernel takes value, sampling_locations and '
                        'attention_weights of one dtype, float32 or float64; '
                        f'got {sorted({str(t.dtype) for t in tensors})}')
    if not _all_finite(sampling_locations, attention_weights):
        # mmcv's sum multiplies the zero sample of such a point: NaN
        return MMCV_CPU_FUNCTION(value, shapes, sampling_locations,
                                 attention_weights)
    return DeformAttnCPUFunction.apply(value, shapes, sampling_locations,
                                       attention_weights)


def _all_finite(*tensors: Tensor) -> bool:
    """Whether every element is finite, by one sum per tensor (a sum that
    overflows reads as not finite: mmcv's function then, still right)."""
    with torch.no_grad():
        return all(bool(torch.isfinite(t.sum())) for t in tensors)


def _kernel_dtypes(*tensors: Tensor) -> bool:
    """Whether the kernel computes in these tensors' dtypes: one of
    :data:`KERNEL_DTYPES` for all, or any float dtypes under CPU autocast
    (which casts them to float32)."""
    if torch.is_autocast_enabled('cpu'):
        return all(t.is_floating_point() for t in tensors)
    return tensors[0].dtype in KERNEL_DTYPES and all(
        t.dtype == tensors[0].dtype for t in tensors)


def _kernel_runs(*tensors: Tensor) -> bool:
    """Whether the kernel can take these tensors as they are: on the CPU,
    of dtypes it computes in (:func:`_kernel_dtypes`), and not traced or
    exported."""
    if torch.jit.is_tracing() or torch.jit.is_scripting() or \
            torch.onnx.is_in_onnx_export():
        return False
    if any(t.device.type != 'cpu' for t in tensors):
        return False
    return _kernel_dtypes(*tensors)


def multi_scale_deformable_attn_cpu(value: Tensor,
                                    value_spatial_shapes: Union[Tensor,
                                                                Sequence],
                                    sampling_locations: Tensor,
                                    attention_weights: Tensor) -> Tensor:
    """mmcv's ``multi_scale_deformable_attn_pytorch``, computed by the
    Cython kernel (:func:`deform_attn_cpu`) unless the model is traced or
    exported or the tensors are of another device or dtype, then by mmcv.

    Args and Returns: as :func:`deform_attn_cpu`.
    """
    if not _kernel_runs(value, sampling_locations, attention_weights):
        return MMCV_CPU_FUNCTION(value, value_spatial_shapes,
                                 sampling_locations, attention_weights)
    return deform_attn_cpu(value, value_spatial_shapes, sampling_locations,
                           attention_weights)


def use_cpu_deform_attn(enabled: bool = True) -> bool:
    """Make mmcv's ``MultiScaleDeformableAttention`` compute its CPU path
    with :func:`multi_scale_deformable_attn_cpu` (or, ``enabled=False``,
    with mmcv's own function again), for every such module of the process.

    Args:
        enabled (bool): whether to use the kernel.

    Returns:
        bool: whether it was in use before.
    """
    before = mmcv_msda.multi_scale_deformable_attn_pytorch is \
        multi_scale_deformable_attn_cpu
    mmcv_msda.multi_scale_deformable_attn_pytorch = (
        multi_scale_deformable_attn_cpu if enabled else MMCV_CPU_FUNCTION)
    return before


@contextmanager
def cpu_deform_attn(enabled: bool = True) -> Iterator[None]:
    """:func:`use_cpu_deform_attn` for a block, restoring the setting
    before it on exit.

    Args:
        enabled (bool): whether the block uses the kernel.
    """
    before = use_cpu_deform_attn(enabled)
    try:
        yield
    finally:
        use_cpu_deform_attn(before)
