# Copyright (c) mmcalidet contributors. All rights reserved.
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from mmcalidet.models import CaliFormer, prior_delta

K, D = 6, 16


def random_prior(seed, k=K):
    gen = torch.Generator().manual_seed(seed)
    prior = torch.rand(k, k, generator=gen)
    prior.fill_diagonal_(1.0)
    return prior


def small_califormer(num_layers=2, **kwargs):
    """A CaliFormer of the test's K and D (2 heads, FFN width 32)."""
    return CaliFormer(
        num_classes=K,
        embed_dims=D,
        num_layers=num_layers,
        num_heads=2,
        feedforward_channels=32,
        **kwargs)


def make_califormer(num_layers=2, seed=0):
    torch.manual_seed(seed)
    model = small_califormer(num_layers)
    model.init_weights()
    # larger nodes than the N(0, 0.01^2) init, so that attention matters
    with torch.no_grad():
        model.nodes.normal_()
    return model.eval()


def test_nodes_init():
    model = CaliFormer(num_classes=80, embed_dims=256)
    model.init_weights()
    assert model.nodes.shape == (80, 256)
    assert abs(model.nodes.std().item() - 0.01) < 0.001
    assert len(model.encoder.layers) == 3


def test_output_depends_on_prior():
    model = make_califormer()
    v1 = model(random_prior(1))
    v2 = model(random_prior(2))
    assert v1.shape == (K, D)
    assert not torch.allclose(v1, v2, atol=1e-4)
    # the flat prior is "no bias": same as a plain transformer over V
    flat = torch.full((K, K), 0.5).fill_diagonal_(1.0)
    assert torch.equal(prior_delta(flat), torch.zeros(K, K))


def test_permutation_equivariance():
    model = make_califormer()
    prior = random_prior(3)
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(4))
    permuted = copy.deepcopy(model)
    with torch.no_grad():
        permuted.nodes.copy_(model.nodes[perm])
    out = model(prior)
    out_perm = permuted(prior[perm][:, perm])
    torch.testing.assert_close(out_perm, out[perm], atol=1e-5, rtol=1e-5)
    # permuting only E (not V) changes the result: E really is per class
    assert not torch.allclose(model(prior[perm][:, perm]), out, atol=1e-4)


def test_attention_bias_is_delta_e_transposed():
    model = make_califormer(num_layers=1)
    priors = torch.stack([random_prior(5), random_prior(6)])
    captured = {}

    def hook(module, args, kwargs):
        captured['mask'] = kwargs['attn_mask']

    attn = model.encoder.layers[0].self_attn.attn
    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    model(priors)
    handle.remove()
    mask = captured['mask']
    heads = model.num_heads
    assert mask.shape == (2 * heads, K, K)
    flat = torch.full((K, K), 0.5).fill_diagonal_(1.0)
    for b in range(2):
        for h in range(heads):
            for i in range(K):
                for j in range(K):
                    expected = priors[b, j, i] - flat[j, i]
                    assert mask[b * heads + h, i,
                                j] == pytest.approx(expected.item())


def manual_layer(layer, x, bias):
    """DetrTransformerEncoderLayer by hand: post-norm MHA + FFN."""
    attn = layer.self_attn.attn
    d = x.shape[-1]
    heads = attn.num_heads
    wq, wk, wv = attn.in_proj_weight.split(d)
    bq, bk, bv = attn.in_proj_bias.split(d)

    def split(t):
        return t.view(t.shape[0], heads, d // heads).transpose(0, 1)

    q, k, v = split(x @ wq.t() + bq), split(x @ wk.t() + bk), \
        split(x @ wv.t() + bv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads) + bias
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(x.shape)
    out = attn.out_proj(out)
    x = layer.norms[0](x + out)
    ffn = layer.ffn.layers
    x = layer.norms[1](x + ffn[1](F.relu(ffn[0][0](x))))
    return x


def test_attention_semantics_by_hand():
    model = make_califormer(num_layers=1)
    prior = random_prior(7)
    delta = prior_delta(prior)
    assert not torch.allclose(delta, delta.t())
    layer = model.encoder.layers[0]
    with torch.no_grad():
        out = model(prior)
        transposed = manual_layer(layer, model.nodes, delta.t())
        untransposed = manual_layer(layer, model.nodes, delta)
    torch.testing.assert_close(out, transposed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, untransposed, atol=1e-4)


def test_batch_computes_each_distinct_prior_once():
    model = make_califormer()
    p1, p2 = random_prior(8), random_prior(9)
    sizes = []
    handle = model.encoder.register_forward_pre_hook(
        lambda m, args, kwargs: sizes.append(kwargs['query'].shape[0]),
        with_kwargs=True)
    out = model(torch.stack([p1, p2, p1, p1]))
    handle.remove()
    assert sizes == [2]
    assert out.shape == (4, K, D)
    torch.testing.assert_close(out[0], model(p1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], model(p2), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[0], out[2]) and torch.equal(out[0], out[3])


def test_gradients_reach_nodes_and_layers():
    model = make_califormer().train()
    out = model(torch.stack([random_prior(1), random_prior(2)]))
    # (a plain sum would be constant: LayerNorm outputs sum to sum(beta))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    (out * weight).sum().backward()
    assert model.nodes.grad.abs().sum() > 1e-3
    assert all(p.grad is not None for p in model.parameters())


def test_bad_shapes():
    model = make_califormer()
    with pytest.raises(ValueError, match='K=6'):
        model(torch.rand(5, 5))
    with pytest.raises(ValueError):
        model(torch.rand(2, 2, K, K))


def test_receptive_field_one_layer_reads_own_column_only():
    """With one layer, V'[i] sees only column i of E (P(. | i)); from two
    layers on, the other columns (so row i, P(i | .)) reach it too. For
    E_x, column i is non-flat exactly when class i is present, with either
    sign: one layer cannot tell E_x from its flip by class i's own entries
    (the reason docs/user_guides/model.md gives for the paper's 3 layers)."""
    prior = random_prior(5)
    i, j = 0, 3
    edited = prior.clone()
    edited[i, j] = 1.0 - edited[i, j]  # P(i | j): row i, column j != i
    edited[2, j] = 1.0 - edited[2, j]
    one, two = make_califormer(num_layers=1), make_califormer(num_layers=2)
    torch.testing.assert_close(one(edited)[i], one(prior)[i])
    assert not torch.allclose(one(edited)[j], one(prior)[j], atol=1e-4)
    assert not torch.allclose(two(edited)[i], two(prior)[i], atol=1e-4)


@pytest.fixture
def mmcv_attention():
    """mmcv's MultiheadAttention; the default ``dropout_layer`` dict it
    writes into is restored after the test."""
    import inspect

    from mmcv.cnn.bricks.transformer import MultiheadAttention
    default = inspect.signature(
        MultiheadAttention.__init__).parameters['dropout_layer'].default
    saved = dict(default)
    yield MultiheadAttention
    default.clear()
    default.update(saved)


@pytest.mark.parametrize('dropout', [0.0, 0.2])
def test_dropout_is_its_own_after_another_attention_was_built(
        mmcv_attention, dropout):
    # D-DETR's decoder builds MultiheadAttention(dropout=0.1): mmcv then
    # keeps 0.1 as the default dropout of every later attention layer
    mmcv_attention(embed_dims=D, num_heads=2, dropout=0.1)
    torch.manual_seed(0)
    model = small_califormer(dropout=dropout).train()
    probs = {
        m.p
        for m in model.modules() if isinstance(m, torch.nn.Dropout)
    } | {
        m.dropout
        for m in model.modules()
        if isinstance(m, torch.nn.MultiheadAttention)
    }
    assert probs == {dropout}
    if dropout == 0.0:  # no dropout: the same prior gives the same V'
        prior = random_prior(1)
        torch.testing.assert_close(model(prior), model(prior))
