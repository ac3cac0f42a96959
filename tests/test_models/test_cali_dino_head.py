# Copyright (c) mmcalidet contributors. All rights reserved.
import numpy as np
import pytest
import torch
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules

import mmcalidet  # noqa: F401
from mmcalidet.priors import label_lists_prior
from testing import demo_batch

K, D, L, Q, B = 80, 256, 2, 5, 2

register_all_modules()


def head_cfg(**kwargs):
    cfg = dict(
        type='CaliDINOHead',
        num_classes=K,
        embed_dims=D,
        num_pred_layer=L + 1,
        as_two_stage=True,
        sync_cls_avg_factor=True,
        loss_cls=dict(
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0),
        califormer=dict(
            type='CaliFormer', num_layers=1, feedforward_channels=64),
        train_cfg=dict(
            assigner=dict(
                type='HungarianAssigner',
                match_costs=[
                    dict(type='FocalLossCost', weight=2.0),
                    dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                    dict(type='IoUCost', iou_mode='giou', weight=2.0)
                ])),
        test_cfg=dict(max_per_img=10))
    cfg.update(kwargs)
    return cfg


def build_head(**kwargs):
    torch.manual_seed(0)
    head = MODELS.build(head_cfg(**kwargs))
    head.init_weights()
    return head


def decoder_outputs(seed=0, queries=Q):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(L, B, queries, D, generator=gen)
    refs = [torch.rand(B, queries, 4, generator=gen) for _ in range(L + 1)]
    return hidden, refs


def random_prior(seed):
    prior = torch.rand(K, K, generator=torch.Generator().manual_seed(seed))
    return prior.fill_diagonal_(1.0)


def test_calibrated_logits_equal_shifted_weights():
    head = build_head()
    hidden, refs = decoder_outputs()
    cali = head.get_cali_vectors(random_prior(1))
    cls, boxes = head(hidden, refs, cali)
    for layer in range(L):
        fc = head.cls_branches[layer]
        expected = hidden[layer] @ (fc.weight + head.rho * cali).t() + fc.bias
        torch.testing.assert_close(cls[layer], expected, atol=1e-4, rtol=1e-4)
    plain_cls, plain_boxes = DINOHead.forward(head, hidden, refs)
    assert torch.equal(boxes, plain_boxes)
    assert not torch.allclose(cls, plain_cls, atol=1e-3)


def test_scores_follow_prior_boxes_do_not():
    head = build_head()
    hidden, refs = decoder_outputs()
    outs = [
        head(hidden, refs, head.get_cali_vectors(random_prior(s)))
        for s in (1, 2)
    ]
    assert not torch.allclose(outs[0][0], outs[1][0], atol=1e-3)
    assert torch.equal(outs[0][1], outs[1][1])
    # no V' = the flat prior E0
    flat = head.flat_priors(hidden)
    torch.testing.assert_close(
        head(hidden, refs)[0],
        head(hidden, refs, head.get_cali_vectors(flat))[0])


def test_per_sample_cali_vectors():
    head = build_head()
    hidden, refs = decoder_outputs()
    p1, p2 = random_prior(1), random_prior(2)
    per_sample = head(hidden, refs,
                      head.get_cali_vectors(torch.stack([p1, p2])))[0]
    for b, prior in enumerate((p1, p2)):
        shared = head(hidden, refs, head.get_cali_vectors(prior))[0]
        torch.testing.assert_close(
            per_sample[:, b], shared[:, b], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match='cali_vectors'):
        head(hidden, refs, torch.zeros(3, K, D))


def test_one_califormer_shared_and_encoder_branch_untouched():
    head = build_head()
    assert sum(1 for m in head.modules()
               if type(m).__name__ == 'CaliFormer') == 1
    assert len(head.cls_branches) == L + 1
    # rho = 0 is exactly DINO's head
    head0 = build_head(rho=0.0)
    hidden, refs = decoder_outputs()
    cls = head0(hidden, refs, head0.get_cali_vectors(random_prior(1)))[0]
    assert torch.equal(cls, DINOHead.forward(head0, hidden, refs)[0])


def test_zero_init_output_starts_as_the_baseline():
    head = build_head(
        califormer=dict(
            type='CaliFormer',
            num_layers=1,
            feedforward_channels=64,
            zero_init_output=True))
    hidden, refs = decoder_outputs()
    cali = head.get_cali_vectors(random_prior(1))
    assert torch.equal(cali, torch.zeros_like(cali))
    torch.testing.assert_close(
        head(hidden, refs, cali)[0],
        DINOHead.forward(head, hidden, refs)[0])


def loss_inputs(labels, num_dn=4):
    # one denoising group of 2 x (max number of GT) queries, as DINO's
    batch = demo_batch(labels, size=64)
    hidden, refs = decoder_outputs(queries=Q + num_dn)
    enc_cls = torch.randn(B, Q, K)
    enc_coord = torch.rand(B, Q, 4)
    dn_meta = dict(num_denoising_queries=num_dn, num_denoising_groups=1)
    return hidden, refs, enc_cls, enc_coord, batch['data_samples'], dn_meta


def test_loss_has_loma_per_decoder_layer():
    head = build_head()
    hidden, refs, enc_cls, enc_coord, samples, dn_meta = loss_inputs([[1, 2],
                                                                      [3]])
    priors = torch.stack([random_prior(1), random_prior(2)])
    losses = head.loss(
        hidden,
        refs,
        enc_cls,
        enc_coord,
        samples,
        dn_meta,
        cali_vectors=head.get_cali_vectors(priors),
        priors=priors)
    assert {
        'loss_loma', 'd0.loss_loma', 'loss_cls', 'd0.loss_cls', 'enc_loss_cls'
    } <= set(losses)
    assert losses['loss_loma'].item() != 0
    sum(losses.values()).backward()
    assert head.califormer.nodes.grad.abs().sum() > 0
    # without priors: E0, and LoMa vanishes
    losses = head.loss(hidden, refs, enc_cls, enc_coord, samples, dn_meta)
    assert losses['loss_loma'].item() == 0
    with pytest.raises(ValueError, match='priors'):
        head.loss(
            hidden,
            refs,
            enc_cls,
            enc_coord,
            samples,
            dn_meta,
            cali_vectors=head.get_cali_vectors(priors))
    no_loma = build_head(loss_loma=None)
    losses = no_loma.loss(hidden, refs, enc_cls, enc_coord, samples, dn_meta)
    assert not any('loma' in k for k in losses)


def test_loma_uses_matching_queries_only():
    head = build_head()
    hidden, refs, enc_cls, enc_coord, samples, dn_meta = loss_inputs([[1, 2],
                                                                      [3]])
    num_dn = dn_meta['num_denoising_queries']
    hidden.requires_grad_(True)
    priors = torch.stack([random_prior(1), random_prior(2)])
    losses = head.loss(
        hidden,
        refs,
        enc_cls,
        enc_coord,
        samples,
        dn_meta,
        cali_vectors=head.get_cali_vectors(priors),
        priors=priors)
    assert 'dn_loss_cls' in losses
    grad, = torch.autograd.grad(losses['loss_loma'], hidden)
    assert torch.equal(grad[:, :, :num_dn],
                       torch.zeros_like(grad[:, :, :num_dn]))
    assert grad[-1, :, num_dn:].abs().sum() > 0


def test_loma_on_the_matched_class_of_assigned_queries():
    head = build_head(loma_queries='matched_class')
    hidden, refs, enc_cls, enc_coord, samples, dn_meta = loss_inputs([[1, 2],
                                                                      [3]])
    num_dn = dn_meta['num_denoising_queries']
    priors = torch.stack([random_prior(1), random_prior(2)])
    cali = head.get_cali_vectors(priors)
    losses = head.loss(
        hidden,
        refs,
        enc_cls,
        enc_coord,
        samples,
        dn_meta,
        cali_vectors=cali,
        priors=priors)
    # by hand: the matcher's labels (recomputed), then the paper's per-class
    # factor on the assigned class only, averaged over assigned queries
    from mmcalidet.models.losses.loma_loss import loma_class_weights
    outs = head(hidden, refs, cali)
    cls = head.split_outputs(*outs, dn_meta)[0][-1]
    boxes = head.split_outputs(*outs, dn_meta)[1][-1]
    labels = torch.stack(
        head.get_targets(
            list(cls.detach()), list(boxes.detach()),
            [s.gt_instances for s in samples],
            [s.metainfo for s in samples])[0])
    pos = labels < K
    assert int(pos.sum()) == 3  # every ground-truth box is assigned
    w = loma_class_weights(priors,
                           head.get_sample_priors(samples, hidden))
    b_idx, q_idx = torch.nonzero(pos, as_tuple=True)
    c = labels[pos]
    expect = 20.0 * (cls[b_idx, q_idx, c] * w[b_idx, c]).sum() / K / 3
    assert losses['loss_loma'].item() == pytest.approx(expect.item(),
                                                       rel=1e-5)
    # gradient only through assigned queries
    hidden = hidden.clone().requires_grad_(True)
    losses = head.loss(
        hidden,
        refs,
        enc_cls,
        enc_coord,
        samples,
        dn_meta,
        cali_vectors=cali,
        priors=priors)
    grad, = torch.autograd.grad(losses['loss_loma'], hidden)
    g = grad[-1, :, num_dn:].abs().sum(-1)
    assert torch.equal(g > 0, pos)
    assert head._matching_record is None  # nothing kept between calls
    with pytest.raises(ValueError, match='loma_queries'):
        build_head(loma_queries='some')


def paper_loma(scores, prior, sample, gamma, labels=None):
    """LoMa of one decoder layer written out with loops (numpy, float64):
    the paper's per-logit term ``s_j w_j / K`` with ``w_j = (1/K) sum_i
    -sign(E_x - E0)_ij (E - E0)_ij``, reduced as documented: the mean over
    the B x Q matching queries, or (``labels`` given) the assigned class's
    term summed over assigned queries and divided by their number."""
    b_num, q_num, k_num = scores.shape
    flat = np.full((k_num, k_num), 0.5)
    np.fill_diagonal(flat, 1.0)
    total, count = 0.0, 0
    for b in range(b_num):
        w = [
            sum(-np.sign(sample[b, i, j] - flat[i, j]) *
                (prior[b, i, j] - flat[i, j]) for i in range(k_num)) / k_num
            for j in range(k_num)
        ]
        for q in range(q_num):
            if labels is None:
                total += sum(scores[b, q, j] * w[j]
                             for j in range(k_num)) / k_num
                count += 1
            elif labels[b, q] < k_num:
                j = labels[b, q]
                total += scores[b, q, j] * w[j] / k_num
                count += 1
    return gamma * total / max(count, 1)


@pytest.mark.parametrize('loma_queries', ['all', 'matched_class'])
def test_loma_of_every_layer_is_the_paper_formula(loma_queries):
    head = build_head(loma_queries=loma_queries)
    hidden, refs, enc_cls, enc_coord, samples, dn_meta = loss_inputs(
        [[1, 2, 2], [3]])
    priors = torch.stack([random_prior(1), random_prior(2)])
    cali = head.get_cali_vectors(priors)
    with torch.no_grad():
        losses = head.loss(hidden, refs, enc_cls, enc_coord, samples,
                           dn_meta, cali_vectors=cali, priors=priors)
        cls, boxes = head.split_outputs(*head(hidden, refs, cali),
                                        dn_meta)[:2]
    sample = np.stack([
        label_lists_prior([s.gt_instances.labels.numpy()], K)[0]
        for s in samples
    ]).astype(np.float64)
    for layer in range(L):
        labels = None
        if loma_queries == 'matched_class':
            # the matcher run again on the same logits (it is
            # deterministic), independently of the head's record
            labels = torch.stack(
                head.get_targets(
                    list(cls[layer]), list(boxes[layer]),
                    [s.gt_instances for s in samples],
                    [s.metainfo for s in samples])[0]).numpy()
            assert (labels < K).sum() == 4  # every box is assigned
        key = 'loss_loma' if layer == L - 1 else f'd{layer}.loss_loma'
        expected = paper_loma(cls[layer].double().numpy(),
                              priors.double().numpy(), sample, 20.0, labels)
        assert expected != 0
        assert losses[key].item() == pytest.approx(expected, rel=1e-4)


def test_matched_loma_does_not_depend_on_the_order_of_the_matching():
    """The head looks the matching up by the logits it was made for: the
    encoder's proposals matched first (or not at all) change nothing."""
    head = build_head(loma_queries='matched_class')
    hidden, refs, enc_cls, enc_coord, samples, dn_meta = loss_inputs(
        [[1, 2], [3]])
    priors = torch.stack([random_prior(1), random_prior(2)])
    cali = head.get_cali_vectors(priors)
    gts = [s.gt_instances for s in samples]
    metas = [s.metainfo for s in samples]
    with torch.no_grad():
        outs = head(hidden, refs, cali)
        matching = head.split_outputs(*outs, dn_meta)
        reference = head.loss(hidden, refs, enc_cls, enc_coord, samples,
                              dn_meta, cali_vectors=cali, priors=priors)

        def encoder_first_then_layers_reversed():
            head.loss_by_feat_single(enc_cls, enc_coord, gts, metas)
            for layer in reversed(range(L)):
                head.loss_by_feat_single(matching[0][layer],
                                         matching[1][layer], gts, metas)
            return {}

        losses = head.loss_with_loma(encoder_first_then_layers_reversed,
                                     matching[0], priors, samples, hidden)
        for key in ('loss_loma', 'd0.loss_loma'):
            assert losses[key].item() == reference[key].item()
        # logits that were never matched are an error, not a guess
        with pytest.raises(RuntimeError, match='decoder layer 0'):
            head.loss_with_loma(lambda: {}, matching[0], priors, samples,
                                hidden)
    assert head._matching_record is None
