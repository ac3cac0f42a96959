# Copyright (c) mmcalidet contributors. All rights reserved.
"""Comparisons say what they compared: ``prior_changes`` matches two
predictions' detections by label and box and compares their scores (the
same counts per class with other scores or boxes are changes), the line
prints the threshold as given, and ``verify_onnx``'s RoI pairing pairs
boxes whatever their order and counts a moved one out."""
import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from mmcalidet.apis.prior_comparison import (describe_changes, prior_changes,
                                             threshold_text)
from mmcalidet.deploy.verify_pairs import pair_rois, report_failures

CLASSES = ['person', 'bicycle', 'car']
BOXES = [[0., 0, 10, 10], [20, 20, 40, 40], [50, 0, 60, 30]]


def sample(labels, scores, boxes=BOXES):
    pred = DetDataSample()
    pred.pred_instances = InstanceData(
        labels=torch.tensor(labels),
        scores=torch.tensor(scores),
        bboxes=torch.tensor(boxes[:len(labels)]))
    return pred


def test_same_counts_with_other_scores_are_a_change():
    first = sample([0, 1, 2], [0.9, 0.8, 0.7])
    second = sample([0, 1, 2], [0.9, 0.5, 0.7])  # bicycle rescored
    changes = prior_changes(first, second, CLASSES, 0.3)
    assert [c['class_name'] for c in changes] == ['bicycle']
    change, = changes
    assert (change['count'], change['other_count'], change['paired'],
            change['rescored']) == (1, 1, 1, 1)
    assert change['max_score_change'] == pytest.approx(0.3, abs=1e-6)
    line = describe_changes(changes, 0.3, 3)
    assert 'same' not in line and 'bicycle 1 -> 1' in line
    assert 'rescored by up to 0.3' in line


def test_same_counts_with_another_box_are_a_change():
    first = sample([0, 1], [0.9, 0.8])
    moved = [BOXES[0], BOXES[2]]  # the bicycle is another box
    second = sample([0, 1], [0.9, 0.8], moved)
    change, = prior_changes(first, second, CLASSES, 0.3)
    assert change['class_name'] == 'bicycle' and change['paired'] == 0
    # a label that moves to another class is two changes
    relabelled = sample([0, 2], [0.9, 0.8])
    names = {
        c['class_name']
        for c in prior_changes(first, relabelled, CLASSES, 0.3)
    }
    assert names == {'bicycle', 'car'}


def test_identical_detections_say_how_many_were_compared():
    first = sample([0, 1, 2], [0.9, 0.8, 0.7])
    assert prior_changes(first, first, CLASSES, 0.3) == []
    line = describe_changes([], 0.3, 3)
    assert line.startswith('same 3 detections at score >= 0.3 ')
    assert 'labels' in line and 'boxes' in line and 'scores' in line


@pytest.mark.parametrize('thr, text', [(0.993, '0.993'), (0.005, '0.005'),
                                       (0.3, '0.3'), (1.0, '1.0')])
def test_the_threshold_is_printed_as_given(thr, text):
    assert threshold_text(thr) == text
    first = sample([0, 1], [0.995, 0.999])
    second = sample([0], [0.995])
    line = describe_changes(prior_changes(first, second, CLASSES, thr), thr)
    assert f'>= {text}' in line


def test_a_prediction_without_boxes_is_refused():
    pred = DetDataSample()
    pred.pred_instances = InstanceData(
        labels=torch.tensor([0]), scores=torch.tensor([0.5]))
    with pytest.raises(ValueError, match='bboxes'):
        prior_changes(pred, pred, CLASSES, 0.3)


def test_rois_pair_in_any_order_and_a_moved_one_is_left_out():
    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 100, (30, 3, 4)).astype(np.float32)
    order = rng.permutation(30)
    assert pair_rois(ref[order], ref, 1e-4) == 30
    moved = ref[order].copy()
    moved[4, 2] += 0.5  # one class's box of one RoI
    assert pair_rois(moved, ref, 1e-4) == 29
    assert pair_rois(ref[:0], ref, 1e-4) == 0
    assert pair_rois(ref[:10], ref, 1e-4) == 10


def report(**changes):
    base = dict(
        images=2,
        paired=0,
        max_box_diff=0.0,
        max_score_diff=0.0,
        labels_equal=True,
        boxes_fixed=True)
    base.update(changes)
    return base


def test_a_verification_that_paired_too_few_fails_and_says_how_many():
    failures = report_failures(report(paired=0), 1e-4, 10)
    assert len(failures) == 1
    assert 'only 0 detection(s) paired' in failures[0]
    assert 'at least 10' in failures[0] and '2 input(s)' in failures[0]
    assert report_failures(report(paired=10), 1e-4, 10) == []
    # a two-stage graph: every RoI must pair
    rois = report(paired=10, rois=[5, 7], rois_paired=11)
    failure, = report_failures(rois, 1e-4, 10)
    assert '11 of 12 RoIs paired' in failure
