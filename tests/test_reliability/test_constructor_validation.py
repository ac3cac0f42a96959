# Copyright (c) mmcalidet contributors. All rights reserved.
"""Public constructors refuse what would give a silently wrong result: the
post-hoc corrections a NaN or out-of-range E_ref, class frequencies or
priors of another K; ``Prior`` a set of class names (its order changes
from run to run); a COCO file with duplicated image ids or broken boxes
(``compute_prior.py``'s and ``fit_site_prior.py``'s one check); the
compiled kernel a thread count OpenMP would try to allocate; the online
calibrator junk predictions and states. Each refusal is one line."""
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from mmcalidet.calibration import OnlineSelfCalibrator
from mmcalidet.deploy import OnnxDetector, fold_prior
from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                            PriorReweighting, build_correction)
from mmcalidet.priors import Prior, flat_prior
from mmcalidet.priors.dataset_prior import prior_from_source
from mmcalidet.priors.label_io import coco_label_sets
from mmcalidet.utils.validation import check_device
from testing import random_prior

K = 3
NAN = float('nan')
FREQ = [0.1, 0.2, 0.3]


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert '\n' not in message, message
    return message


# --- 5. the post-hoc corrections ----------------------------------------


@pytest.mark.parametrize('ref, freq, problem', [
    (flat_prior(K), [NAN, .2, .3], 'class_freq holds a non-finite value'),
    (flat_prior(K), [0.1, 0.2], r'class_freq must be \(K,\) = \(3,\)'),
    (flat_prior(K), [0.0, 0.2, 0.3], r'must lie in \(0, 1\), got 0 at '),
    (np.full((K, K), NAN), FREQ, 'non-finite value nan'),
    (np.full((K, K), 1.5), FREQ, r'must lie in \[0, 1\], got 1.5'),
    (np.ones((K, K + 1)), FREQ, 'square K x K'),
])
def test_the_reweighting_refuses_nan_range_and_k(ref, freq, problem):
    with pytest.raises(ValueError, match=problem) as exc:
        PriorReweighting(ref, freq)
    assert one_line(exc).startswith('PriorReweighting')
    # build_correction passes nothing through
    with pytest.raises(ValueError, match=problem):
        build_correction('reweight', ref, np.asarray(freq))


@pytest.mark.parametrize('ref, problem', [
    (np.full((K, K), NAN), 'non-finite value nan'),
    (np.full((K, K), 2.0), r'must lie in \[0, 1\]'),
    (np.ones(K), 'square K x K'),
])
def test_the_cooccurrence_rescoring_refuses_nan_range(ref, problem):
    for make in (lambda: CooccurrenceRescoring(ref),
                 lambda: build_correction('cooccurrence', ref)):
        with pytest.raises(ValueError, match=problem) as exc:
            make()
        assert one_line(exc).startswith('CooccurrenceRescoring')


def test_the_corrections_refuse_priors_of_another_k_or_nan():
    ref = random_prior(0, K)
    logits = torch.randn(2, 5, K)
    for corr in (PriorReweighting(ref, FREQ), CooccurrenceRescoring(ref)):
        with pytest.raises(ValueError, match=r'K=3 .*got shape \(4, 4\)') \
                as exc:
            corr(logits, flat_prior(K + 1))
        one_line(exc)
        bad = np.array(ref)
        bad[0, 1] = NAN
        with pytest.raises(ValueError, match='the priors holds a non-finite'):
            corr(logits, bad)
        with pytest.raises(ValueError, match=r'in \[0, 1\], got 1.5'):
            corr(logits, np.full((2, K, K), 1.5))
        # valid priors: finite, the identity at E_ref, a (B, K, K) stack
        torch.testing.assert_close(corr(logits, ref), logits)
        other = corr(logits, np.stack([ref, flat_prior(K)]))
        assert torch.isfinite(other).all()
    # a Prior is taken as its matrix
    named = Prior(ref, ['a', 'b', 'c'])
    torch.testing.assert_close(
        CooccurrenceRescoring(named)(logits, flat_prior(K)),
        CooccurrenceRescoring(ref)(logits, flat_prior(K)))


# --- 6. Prior's class names are an ordered sequence ---------------------


@pytest.mark.parametrize('names', [
    {'cat', 'dog', 'person'},
    frozenset({'cat', 'dog', 'person'}),
    dict.fromkeys(['cat', 'dog', 'person']).keys(),
    dict.fromkeys(['cat', 'dog', 'person']),
])
def test_prior_refuses_unordered_class_names(names):
    with pytest.raises(ValueError, match='ordered sequence') as exc:
        Prior(flat_prior(K), names)
    assert 'changes from run to run' in one_line(exc)
    with pytest.raises(ValueError, match='ordered sequence'):
        Prior(flat_prior(K), ['cat', 'dog', 'person']).reorder(names)


def test_prior_takes_lists_tuples_and_arrays_of_names():
    names = ['cat', 'dog', 'person']
    for given in (names, tuple(names), np.array(names)):
        assert Prior(flat_prior(K), given).classes == tuple(names)


# --- 7. one check of COCO files: duplicated ids, broken boxes -----------


def coco(images=(1, 2), boxes=([1, 2, 3, 4], [0, 0, 5, 5])):
    return dict(
        images=[
            dict(id=i, file_name=f'{k}.jpg') for k, i in enumerate(images)
        ],
        annotations=[
            dict(
                id=k,
                image_id=images[min(k,
                                    len(images) - 1)],
                category_id=1,
                bbox=box) for k, box in enumerate(boxes)
        ],
        categories=[dict(id=1, name='cat')])


@pytest.mark.parametrize('data, problem', [
    (coco(images=(1, 1)), r'duplicated image id 1 \(images\[0\] and '),
    (coco(boxes=([1, 2, NAN, 4], )), 'non-finite "bbox"'),
    (coco(boxes=([1, 2, math.inf, 4], )), 'non-finite "bbox"'),
    (coco(boxes=([1, 2, -3, 4], )), 'negative "bbox"'),
    (coco(boxes=([1, 2, 3], )), r'must be 4 numbers'),
    (coco(boxes=([1, 2, '3', 4], )), r'must be 4 numbers'),
])
def test_coco_files_are_checked_once_for_both_tools(tmp_path, data, problem):
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=problem) as exc:
        coco_label_sets(data, str(path))
    assert str(path) in one_line(exc)
    # compute_prior.py's reader refuses it as fit_site_prior.py does
    # (test_refuse_before_work.py runs the tools)
    with pytest.raises(ValueError, match=problem):
        prior_from_source(str(path), progress=False)


def test_a_coco_file_of_valid_boxes_is_read(tmp_path):
    sets = coco_label_sets(coco(), 'ann.json')
    assert sets.num_images == 2 and sets.classes == ['cat']


def test_a_source_of_no_images_is_refused(tmp_path):
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps(coco(images=(), boxes=())))
    with pytest.raises(ValueError, match='holds no images') as exc:
        prior_from_source(str(path), progress=False)
    assert str(path) in one_line(exc)


# --- the compiled kernel's thread count (the crash) ---------------------


@pytest.mark.parametrize('threads', [0, -5, 10**6])
def test_the_kernel_refuses_a_thread_count_outside_its_range(threads):
    from mmcalidet.models.layers import cpu_deform_attn
    kernel = cpu_deform_attn.KERNEL
    bs, heads, dims, queries, levels, points = 1, 2, 4, 3, 1, 2
    value = np.ones((bs, 4, heads, dims), np.float32)
    shapes = np.array([[2, 2]], np.int64)
    starts = np.array([0], np.int64)
    locations = np.full((bs, queries, heads, levels, points, 2), 0.5,
                        np.float32)
    attention = np.full((bs, queries, heads, levels, points), 0.5, np.float32)
    output = np.zeros((bs, queries, heads, dims), np.float32)
    with pytest.raises(
            ValueError,
            match=r'num_threads must be an integer '
            rf'in \[1, 1024\], got {threads}'):
        kernel.deform_attn_forward(value, shapes, starts, locations, attention,
                                   output, threads)
    grads = (np.zeros_like(value), np.zeros_like(locations),
             np.zeros_like(attention))
    with pytest.raises(ValueError, match='num_threads must be'):
        kernel.deform_attn_backward(value, shapes, starts, locations,
                                    attention, output, *grads, threads)
    # one thread computes: each query sums its points' weights x 1
    kernel.deform_attn_forward(value, shapes, starts, locations, attention,
                               output, 1)
    np.testing.assert_allclose(output, 1.0, rtol=1e-6)


# --- tracebacks where one line belongs ----------------------------------


def test_the_online_calibrator_refuses_junk_in_one_line():
    calibrator = OnlineSelfCalibrator(init_prior=flat_prior(K))
    with pytest.raises(ValueError, match="prediction 0 has no 'scores'") \
            as exc:
        calibrator.update(['junk'])
    one_line(exc)
    with pytest.raises(ValueError, match='2 scores and 1 labels'):
        calibrator.update([dict(scores=[0.5, 0.6], labels=[1])])
    assert calibrator.num_images == 0
    state = calibrator.state_dict()
    with pytest.raises(
            ValueError, match=r"missing \[.*'counts'.*unknown "
            r"\['bogus'\]") as exc:
        calibrator.load_state_dict({'bogus': 1})
    one_line(exc)
    with pytest.raises(ValueError, match=r'counts must be \(3,\)'):
        calibrator.load_state_dict(dict(state, counts=np.ones(4)))
    with pytest.raises(ValueError, match='score_sum holds a non-finite'):
        calibrator.load_state_dict(dict(state, score_sum=np.full(K, NAN)))
    with pytest.raises(ValueError, match='num_images must be an integer'):
        calibrator.load_state_dict(dict(state, num_images=-1))
    # a valid state round-trips
    calibrator.update([dict(scores=[0.9], labels=[1])])
    other = OnlineSelfCalibrator(init_prior=flat_prior(K))
    other.load_state_dict(calibrator.state_dict())
    assert other.num_images == 1
    np.testing.assert_allclose(other.counts, calibrator.counts)


def test_fold_prior_refuses_a_plain_detector():
    with pytest.raises(
            ValueError,
            match='needs a calibratable detector '
            r'\(CaliDet\), got Linear') as exc:
        fold_prior(nn.Linear(2, 2), flat_prior(K))
    one_line(exc)


def test_the_onnx_runtime_refuses_a_list_of_priors():
    detector = OnnxDetector.__new__(OnnxDetector)  # no graph needed
    with pytest.raises(
            ValueError, match='one prior per call, got a list '
            'of 2 priors'):
        detector.resolve(['a.json', 'b.json'])
    with pytest.raises(ValueError, match='got a list of 2 priors'):
        detector.resolve([flat_prior(K), flat_prior(K)])


def test_a_cuda_device_on_a_cpu_only_torch_is_one_line(monkeypatch):
    check_device(None)
    check_device('cpu')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(ValueError, match=r"--device 'cuda:0': .* \(use cpu\)"):
        check_device('cuda:0', '--device')
    with pytest.raises(ValueError, match="'gpu0' is not a device name"):
        check_device('gpu0')


def test_a_valid_checkpoint_prior_is_not_named_invalid():
    from mmdet.registry import MODELS

    from testing import get_config
    cfg = get_config('calidet/calidet_deformable-detr_tiny_coco-mini.py')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    name = model.prior_state.value.name
    assert 'invalid' not in name
    assert name == "the checkpoint's prior ('prior' of CaliDeformableDETR)"
