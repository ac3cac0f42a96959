# Copyright (c) mmcalidet contributors. All rights reserved.
"""The compiled CPU kernel of multi-scale deformable attention against
mmcv's own CPU function: the same outputs and gradients, its switch, its
fallbacks."""
import os.path as osp
import platform
import tempfile
from typing import Tuple

import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention
from mmcv.ops import multi_scale_deform_attn as mmcv_msda

from mmcalidet.models.layers import cpu_deform_attn as kernel
from testing import run_tool

#: (h, w) of the demo DINO's four levels on 128-px images, and of a
#: non-square single level as the tiny Deformable DETR has
SHAPES = ([(16, 16), (8, 8), (4, 4), (2, 2)], [(5, 7)])


def inputs(shapes, num_queries=23, bs=2, heads=4, dims=8, points=3, seed=0):
    """Random value, locations (some outside [0, 1], some on the edge)
    and softmaxed weights, all requiring gradients."""
    gen = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in shapes)
    value = torch.randn(bs, keys, heads, dims, generator=gen)
    locations = torch.rand(
        bs, num_queries, heads, len(shapes), points, 2,
        generator=gen) * 1.4 - 0.2
    locations[0, 0, 0, 0, 0] = torch.tensor([0.0, 1.0])
    weights = torch.rand(
        bs, num_queries, heads, len(shapes), points, generator=gen).softmax(-1)
    return [t.requires_grad_() for t in (value, locations, weights)]


@pytest.mark.parametrize('shapes', SHAPES)
def test_kernel_matches_mmcv_forward_and_backward(shapes):
    value, locations, weights = inputs(shapes)
    spatial = torch.tensor(shapes)
    ours = kernel.deform_attn_cpu(value, spatial, locations, weights)
    theirs = kernel.MMCV_CPU_FUNCTION(value, spatial, locations, weights)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    grad = torch.randn(
        theirs.shape, generator=torch.Generator().manual_seed(2))
    ours_grad = torch.autograd.grad(ours, (value, locations, weights), grad)
    theirs_grad = torch.autograd.grad(theirs, (value, locations, weights),
                                      grad)
    for name, a, b in zip(('value', 'locations', 'weights'), ours_grad,
                          theirs_grad):
        scale = b.abs().max()
        torch.testing.assert_close(
            a / scale, b / scale, rtol=1e-5, atol=1e-5, msg=name)


def test_backward_passes_gradcheck():
    """The kernel's backward against finite differences (float64), on
    two levels with points inside and outside them."""
    shapes = [(5, 7), (2, 2)]
    gen = torch.Generator().manual_seed(3)
    value = torch.randn(2, 39, 2, 3, dtype=torch.double, generator=gen)
    locations = torch.rand(
        2, 6, 2, 2, 3, 2, dtype=torch.double, generator=gen) * 1.4 - 0.2
    weights = torch.rand(2, 6, 2, 2, 3, dtype=torch.double, generator=gen)
    tensors = [t.requires_grad_() for t in (value, locations, weights)]
    assert torch.autograd.gradcheck(
        lambda v, loc, w: kernel.deform_attn_cpu(v, shapes, loc, w), tensors)


@pytest.mark.parametrize('needs', [(True, False, False), (False, True, False),
                                   (False, False, True)])
def test_gradients_of_only_some_inputs(needs):
    value, locations, weights = inputs(SHAPES[0])
    spatial = torch.tensor(SHAPES[0])
    full = torch.autograd.grad(
        kernel.deform_attn_cpu(value, spatial, locations, weights).sum(),
        (value, locations, weights))
    tensors = [
        t.detach().requires_grad_(need)
        for t, need in zip((value, locations, weights), needs)
    ]
    wanted = [t for t in tensors if t.requires_grad]
    (grad, ) = torch.autograd.grad(
        kernel.deform_attn_cpu(tensors[0], spatial, tensors[1],
                               tensors[2]).sum(), wanted)
    torch.testing.assert_close(grad, full[needs.index(True)])


def test_cpu_autocast_runs_it_in_float32():
    """Under ``torch.autocast('cpu')`` (mmengine's ``--amp`` on the CPU)
    the path computes in float32: what it computes without autocast, and a
    bfloat16 value (a projection's output under autocast) gets a bfloat16
    gradient."""
    value, locations, weights = inputs(SHAPES[0])
    spatial = torch.tensor(SHAPES[0])
    tensors = (value, locations, weights)
    expected = kernel.deform_attn_cpu(value, spatial, locations, weights)
    expected_grad = torch.autograd.grad(expected.sum(), tensors)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kernel.deform_attn_cpu(value, spatial, locations, weights)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(out.sum(), tensors), expected_grad):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    half = value.detach().bfloat16().requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = kernel.deform_attn_cpu(half, spatial, locations, weights)
    (grad, ) = torch.autograd.grad(out.sum(), half)
    assert grad.dtype == torch.bfloat16 and bool(grad.isfinite().all())


def test_points_outside_every_level_sample_zeros():
    value, locations, weights = inputs(SHAPES[0])
    with torch.no_grad():
        locations.fill_(1.6)
    out = kernel.deform_attn_cpu(value, torch.tensor(SHAPES[0]), locations,
                                 weights)
    assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize('where', ['location', 'weight'])
@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_non_finite_points_give_non_finite_outputs_as_mmcv(where, bad):
    """A NaN or infinite location or weight is not read as a point outside
    the map (a zero sample): its query's output is NaN, as mmcv's is, so
    the training's non-finite check stops on it; a huge finite location
    samples zeros in both."""
    value, locations, weights = inputs(SHAPES[0])
    with torch.no_grad():
        locations[1, 5, 2, 0, 1, 0] = 1e30  # far outside: zeros
        if where == 'location':
            locations[0, 3, 1, 2, 0, 1] = bad
        else:
            locations[0, 3, 1, 2, 0] = 1.5  # outside its level
            weights[0, 3, 1, 2, 0] = bad
    spatial = torch.tensor(SHAPES[0])
    tensors = (value, locations, weights)
    ours = kernel.deform_attn_cpu(value, spatial, locations, weights)
    theirs = kernel.MMCV_CPU_FUNCTION(value, spatial, locations, weights)
    assert torch.equal(ours.isfinite(), theirs.isfinite())
    assert not ours[0, 3].isfinite().all()
    finite = ours.isfinite()
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=1e-5,
                               atol=1e-5)
    ours_grad = torch.autograd.grad(ours.nansum(), tensors)
    theirs_grad = torch.autograd.grad(theirs.nansum(), tensors)
    # the value's gradient stays finite in both; a point mmcv gives a
    # non-finite gradient has one here
    assert ours_grad[0].isfinite().all() and theirs_grad[0].isfinite().all()
    for a, b in zip(ours_grad[1:], theirs_grad[1:]):
        assert not a[~b.isfinite()].isfinite().any()


def test_kernel_module_follows_the_cpu(monkeypatch):
    """The AVX2 build where torch finds AVX2 or AVX-512 (x86-64, where
    setup.py builds it), the baseline one otherwise."""
    from mmcalidet.models.layers import _deform_attn_cpu
    monkeypatch.setattr(torch.backends.cpu, 'get_cpu_capability',
                        lambda: 'DEFAULT')
    assert kernel._kernel_module() is _deform_attn_cpu
    if platform.machine().lower() in ('x86_64', 'amd64'):
        from mmcalidet.models.layers import _deform_attn_cpu_avx2
        for capability in ('AVX2', 'AVX512'):
            monkeypatch.setattr(torch.backends.cpu, 'get_cpu_capability',
                                lambda: capability)
            assert kernel._kernel_module() is _deform_attn_cpu_avx2


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ('AVX2', 'AVX512'),
    reason='this CPU cannot run the AVX2 build')
def test_avx2_and_baseline_builds_agree(monkeypatch):
    from mmcalidet.models.layers import _deform_attn_cpu, _deform_attn_cpu_avx2
    value, locations, weights = inputs(SHAPES[0])
    spatial = torch.tensor(SHAPES[0])
    tensors = (value, locations, weights)
    results = []
    for module in (_deform_attn_cpu, _deform_attn_cpu_avx2):
        monkeypatch.setattr(kernel, 'KERNEL', module)
        out = kernel.deform_attn_cpu(value, spatial, locations, weights)
        results.append((out, *torch.autograd.grad(out.sum(), tensors)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_shapes_that_do_not_cover_the_keys_are_refused():
    value, locations, weights = inputs(SHAPES[0])
    with pytest.raises(ValueError, match='cover 339 keys, value has 340'):
        kernel.deform_attn_cpu(
            value, torch.tensor([(16, 16), (8, 8), (4, 4), (1, 3)]), locations,
            weights)


def run_in_subprocess(call: str, num_levels: int) -> Tuple[int, str]:
    """Run ``call`` in a fresh Python process, after making random inputs
    as :func:`inputs` does (340 keys, ``num_levels`` levels) as ``value``,
    ``locations`` and ``weights``: an input the kernel once read outside
    its arrays with may crash that process, not the test run.

    Args:
        call (str): a statement that reads ``kernel`` (this file's module
            under test), ``torch`` and the three tensors.
        num_levels (int): the levels of ``locations`` and ``weights``.

    Returns:
        tuple[int, str]: the process's return code (1 for an uncaught
        exception, negative for a signal) and its stderr.

    Raises:
        subprocess.TimeoutExpired: the process ran for over 300 s.
    """
    code = ('import torch\n'
            'from mmcalidet.models.layers import cpu_deform_attn as kernel\n'
            'gen = torch.Generator().manual_seed(0)\n'
            'value = torch.randn(2, 340, 4, 8, generator=gen)\n'
            f'locations = torch.rand(2, 23, 4, {num_levels}, 3, 2, '
            'generator=gen)\n'
            f'weights = torch.rand(2, 23, 4, {num_levels}, 3, '
            'generator=gen)\n'
            f'{call}\n')
    # a process of its own, forked from the tool server's interpreter that
    # has imported mmcalidet already (testing.run_tool)
    with tempfile.TemporaryDirectory() as folder:
        script = osp.join(folder, 'kernel_call.py')
        with open(script, 'w') as f:
            f.write(code)
        proc = run_tool(script, timeout=300)
    return proc.returncode, proc.stderr


@pytest.mark.slow  # a subprocess: the old kernel read out of bounds
def test_negative_level_shapes_are_refused():
    """(40, 10) and (-6, 10) add up to the 340 keys; the kernel read 400
    keys of level 0."""
    rc, stderr = run_in_subprocess(
        'kernel.deform_attn_cpu(value, [(40, 10), (-6, 10)], locations, '
        'weights)',
        num_levels=2)
    assert rc == 1, stderr
    assert 'ValueError: value_spatial_shapes must be positive; level 1 is ' \
        '(-6, 10)' in stderr


@pytest.mark.slow  # a subprocess: the old kernel crashed (SIGSEGV)
def test_huge_level_shapes_are_refused():
    """2**62 * 4 wraps around int64 to 0, so that the sum was the 340 keys
    and the kernel read far outside the value."""
    rc, stderr = run_in_subprocess(
        'kernel.multi_scale_deformable_attn_cpu(value, torch.tensor([(1 << '
        '62, 4), (20, 17)]), locations, weights)',
        num_levels=2)
    assert rc == 1, stderr
    assert 'ValueError: value_spatial_shapes cover 18446744073709551956 ' \
        'keys, value has 340' in stderr


@pytest.mark.slow  # a subprocess: the old kernel read out of bounds
@pytest.mark.parametrize('direction', ['forward', 'backward'])
def test_kernel_refuses_level_starts_that_do_not_match(direction):
    """The compiled entries take the level starts from their caller; one
    past the cumulative sums of h * w read beyond the last key."""
    forward = ('kernel.KERNEL.deform_attn_forward(*arrays, '
               'torch.zeros(2, 23, 4, 8).numpy(), 1)')
    backward = ('kernel.KERNEL.deform_attn_backward(*arrays, '
                'torch.ones(2, 23, 4, 8).numpy(), '
                'torch.zeros_like(value).numpy(), '
                'torch.zeros_like(locations).numpy(), '
                'torch.zeros_like(weights).numpy(), 1)')
    rc, stderr = run_in_subprocess(
        'shapes = torch.tensor([(16, 16), (8, 8), (4, 4), (2, 2)])\n'
        'starts = torch.tensor([0, 256, 320, 337])\n'
        'arrays = [t.numpy() for t in (value, shapes, starts, locations, '
        'weights)]\n' + (forward if direction == 'forward' else backward),
        num_levels=4)
    assert rc == 1, stderr
    assert 'ValueError: starts must be the cumulative sums of h * w; level ' \
        '3 starts at 337, not 336' in stderr


@pytest.mark.parametrize(
    'shapes',
    [torch.tensor([(8.5, 10.2)]), [(8.5, 10.2)],
     torch.tensor([(8.0, 10.0)])])
def test_fractional_level_shapes_are_refused(shapes):
    """Float shapes were truncated to (8, 10), which covers the 80 keys;
    mmcv's function takes no float shapes, integral ones included."""
    value, locations, weights = inputs([(8, 10)])
    for function in (kernel.deform_attn_cpu,
                     kernel.multi_scale_deformable_attn_cpu):
        with pytest.raises(
                TypeError,
                match='value_spatial_shapes must be of an integer dtype'):
            function(value, shapes, locations, weights)


@pytest.mark.parametrize('shapes', [
    torch.tensor([5, 7]),
    torch.tensor([[[5, 7]]]),
    torch.tensor([(5, 7, 1)]),
    torch.zeros((0, 2), dtype=torch.long)
])
def test_level_shapes_not_shaped_levels_by_two_are_refused(shapes):
    """A 1-D (h, w) raised an IndexError, an (h, w, 1) was taken as
    (h, w)."""
    value, locations, weights = inputs(SHAPES[1])
    for function in (kernel.deform_attn_cpu,
                     kernel.multi_scale_deformable_attn_cpu):
        with pytest.raises(
                ValueError,
                match=r'value_spatial_shapes must be \(num_levels, 2\)'):
            function(value, shapes, locations, weights)


def test_levels_other_than_the_locations_are_refused():
    """Three levels that cover the 340 keys, locations of four."""
    value, locations, weights = inputs(SHAPES[0])
    shapes = [(16, 16), (8, 8), (4, 5)]
    with pytest.raises(
            ValueError,
            match='sampling_locations must be of the 3 levels of '
            r'value_spatial_shapes \(dim 3 .*\); got 4'):
        kernel.deform_attn_cpu(value, shapes, locations, weights)


def test_tracing_other_dtypes_and_devices_take_mmcv_function(monkeypatch):
    calls = []

    def mmcv_function(*args):
        calls.append(args)

    monkeypatch.setattr(kernel, 'MMCV_CPU_FUNCTION', mmcv_function)
    value, locations, weights = inputs(SHAPES[1])
    spatial = torch.tensor(SHAPES[1])
    kernel.multi_scale_deformable_attn_cpu(value, spatial, locations, weights)
    assert not calls
    # float64 runs in the kernel, mixed dtypes and half precision do not
    kernel.multi_scale_deformable_attn_cpu(value.double(), spatial,
                                           locations.double(),
                                           weights.double())
    assert not calls
    kernel.multi_scale_deformable_attn_cpu(value.double(), spatial, locations,
                                           weights)
    assert len(calls) == 1
    kernel.multi_scale_deformable_attn_cpu(value.bfloat16(), spatial,
                                           locations.bfloat16(),
                                           weights.bfloat16())
    assert len(calls) == 2
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
    kernel.multi_scale_deformable_attn_cpu(value, spatial, locations, weights)
    assert len(calls) == 3


def test_mismatched_locations_and_weights_are_refused():
    value, locations, weights = inputs(SHAPES[0])
    spatial = torch.tensor(SHAPES[0])
    with pytest.raises(ValueError, match='sampling_locations must be'):
        kernel.deform_attn_cpu(value, spatial, locations[..., :3, :, :],
                               weights[..., :3, :])
    with pytest.raises(ValueError, match='sampling_locations must be'):
        kernel.deform_attn_cpu(value, spatial, locations, weights[..., :2])
    with pytest.raises(TypeError, match='of one dtype, float32 or float64'):
        kernel.deform_attn_cpu(value.double(), spatial, locations, weights)
    with pytest.raises(TypeError, match='of one dtype, float32 or float64'):
        kernel.deform_attn_cpu(value.half(), spatial, locations.half(),
                               weights.half())


@pytest.mark.parametrize('threads', [1, 3])
def test_result_does_not_depend_on_the_threads(threads):
    """Each (batch element, head) pair sums in one thread, in one order."""
    value, locations, weights = inputs(SHAPES[0], heads=3)
    spatial = torch.tensor(SHAPES[0])
    tensors = (value, locations, weights)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = kernel.deform_attn_cpu(value, spatial, locations, weights)
        grads = torch.autograd.grad(out.sum(), tensors)
        torch.set_num_threads(threads)
        other = kernel.deform_attn_cpu(value, spatial, locations, weights)
        other_grads = torch.autograd.grad(other.sum(), tensors)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(other, out, rtol=0, atol=0)
    for a, b in zip(other_grads, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_switch_routes_mmcv_module_and_restores_it():
    module = MultiScaleDeformableAttention(
        embed_dims=32,
        num_heads=4,
        num_levels=4,
        num_points=3,
        dropout=0.0,
        batch_first=True).eval()
    shapes = torch.tensor(SHAPES[0])
    starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(2, 11, 32, generator=gen)
    value = torch.randn(2, 340, 32, generator=gen)
    reference = torch.rand(2, 11, 4, 2, generator=gen)

    def run():
        return module(
            query,
            value=value,
            reference_points=reference,
            spatial_shapes=shapes,
            level_start_index=starts)

    original = mmcv_msda.multi_scale_deformable_attn_pytorch
    with kernel.cpu_deform_attn(False):
        assert mmcv_msda.multi_scale_deformable_attn_pytorch is \
            kernel.MMCV_CPU_FUNCTION
        expected = run()
    with kernel.cpu_deform_attn():
        assert mmcv_msda.multi_scale_deformable_attn_pytorch is \
            kernel.multi_scale_deformable_attn_cpu
        torch.testing.assert_close(run(), expected, rtol=1e-5, atol=1e-5)
    assert mmcv_msda.multi_scale_deformable_attn_pytorch is original
