# Copyright (c) mmcalidet contributors. All rights reserved.
"""What benchmarks/audit_hostile_inputs.py found, refused in one line: a
prior saved with negative ``decimals`` (its diagonal rounded away), a
file whose ``images_per_class`` counts a name that is no class, a
correction called with more priors than images, predictions with scores
outside [0, 1] or labels that are not integers, an export of a shape
that is not two integers >= 1 or an opset below 16, a NaN image given to
the ONNX runtime."""
import json

import numpy as np
import pytest
import torch
from torch import nn

from mmcalidet.calibration import OnlineSelfCalibrator
from mmcalidet.deploy import OnnxDetector, export_onnx
from mmcalidet.deploy.export import check_input_shape
from mmcalidet.evaluation.baselines import (CooccurrenceRescoring,
                                            PriorReweighting)
from mmcalidet.priors import Prior, flat_prior
from testing import random_prior

K3 = ['cat', 'dog', 'person']


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert '\n' not in message, message
    return message


@pytest.mark.parametrize('decimals', [-1, 1.5, '2'])
def test_save_refuses_decimals_that_are_no_count(tmp_path, decimals):
    path = tmp_path / 'p.json'
    with pytest.raises(ValueError, match='decimals must be an integer >= 0') \
            as exc:
        Prior(random_prior(0, 3), K3).save(str(path), decimals=decimals)
    one_line(exc)
    assert not path.exists()
    # a valid rounding keeps a valid prior
    Prior(random_prior(0, 3), K3).save(str(path), decimals=0)
    assert np.allclose(np.diag(Prior.load(str(path)).matrix), 1)


def test_a_count_of_no_class_is_refused():
    entry = dict(
        matrix=random_prior(0, 3).tolist(),
        classes=K3,
        num_images=10,
        images_per_class=dict(cat=1, dog=2, person=3, cow=4))
    with pytest.raises(ValueError, match="counts 'cow', which is not one") \
            as exc:
        Prior.load(entry)
    one_line(exc)
    # names matched up to case and '_' are the classes'
    entry['images_per_class'] = dict(Cat=1, dog=2, person=3)
    np.testing.assert_allclose(Prior.load(entry).marginals, [.1, .2, .3])


@pytest.mark.parametrize('make', [
    lambda ref: PriorReweighting(ref, [0.1, 0.2, 0.3]),
    lambda ref: CooccurrenceRescoring(ref),
])
def test_the_corrections_refuse_more_priors_than_images(make):
    ref = random_prior(1, 3)
    corr = make(ref)
    logits = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match='3 priors for a batch of 2') as exc:
        corr(logits, np.stack([ref] * 3))
    one_line(exc)
    # a Prior is taken as its matrix in the call as in the constructor
    other = random_prior(4, 3)
    torch.testing.assert_close(
        corr(logits, Prior(other, K3)), corr(logits, other))


@pytest.mark.parametrize('pred, problem', [
    (dict(scores=[1.5], labels=[1]), r'score of 1.5: scores must lie in'),
    (dict(scores=[-0.5], labels=[1]), 'score of -0.5'),
    (dict(scores=[0.9], labels=[1.5]), 'labels that are not integers'),
])
def test_the_online_calibrator_refuses_scores_and_labels(pred, problem):
    calibrator = OnlineSelfCalibrator(init_prior=flat_prior(3))
    with pytest.raises(ValueError, match=problem) as exc:
        calibrator.update([pred])
    one_line(exc)
    assert calibrator.num_images == 0
    # a NaN score counts as no detection (documented); float labels of
    # integer value are labels
    calibrator.update([dict(scores=[float('nan')], labels=[1])])
    calibrator.update([dict(scores=[0.9], labels=np.array([2.0]))])
    assert calibrator.num_images == 2 and calibrator.counts[2] > 0


@pytest.mark.parametrize('shape', [(0, 0), (-64, 64), (64, ), (64.5, 64),
                                   'ab', None])
def test_an_export_shape_is_two_positive_integers(shape):
    with pytest.raises(ValueError, match='input_shape must be') as exc:
        check_input_shape(shape)
    one_line(exc)
    assert check_input_shape((64, 96.0)) == (64, 96)


def test_export_checks_the_shape_and_opset_before_tracing(tmp_path):
    model = nn.Linear(2, 2)  # no tracing is reached
    out = tmp_path / 'x.onnx'
    with pytest.raises(ValueError, match='input_shape must be'):
        export_onnx(model, str(out), (0, 0), prior_input=False)
    with pytest.raises(ValueError, match='opset must be an integer >= 16'):
        export_onnx(model, str(out), (64, 64), prior_input=False, opset=7)
    assert not out.exists()


def test_the_onnx_runtime_refuses_a_nan_image():
    detector = OnnxDetector.__new__(OnnxDetector)  # no graph needed
    detector.meta = dict(input_shape=[32, 32])
    image = np.zeros((8, 8, 3), np.float32)
    image[2, 3, 1] = float('nan')
    with pytest.raises(ValueError, match='the image holds a non-finite') \
            as exc:
        detector.preprocess(image)
    one_line(exc)
    with pytest.raises(ValueError, match='array of numbers'):
        detector.preprocess(np.full((8, 8, 3), 'a'))
    tensor, _, _ = detector.preprocess(np.ones((8, 8, 3), np.uint8))
    assert tensor.shape == (1, 3, 32, 32)


def test_the_audit_script_names_its_outcomes():
    """The audit's classes are the ones docs/benchmarks.md counts."""
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / 'benchmarks'))
    try:
        from audit_hostile_inputs import OUTCOMES, Audit
    finally:
        sys.path.pop(0)
    audit = Audit(timeout=5, verbose=False)
    audit.api('x', 'nan', lambda: Prior(np.full((2, 2), np.nan)),
              match='non-finite')
    audit.api('x', 'internal', lambda: [][1])
    audit.api('x', 'taken', lambda: 1)
    audit.api('x', 'valid', lambda: 2, 'accept', check=lambda r: r == 2)
    got = [t['outcome'] for t in audit.tries]
    assert got == ['clean refusal', 'traceback', 'silently wrong', 'correct']
    assert set(got) <= set(OUTCOMES)
    json.dumps(audit.tries)
