# Copyright (c) mmcalidet contributors. All rights reserved.
"""The prior-kind registry (mmcalidet.priors.kinds): the paper's kinds with
their labels, notes and oracle flags, a new kind registered in one place
and found by the evaluation's build_priors."""
import numpy as np
import pytest

from mmcalidet.evaluation import CONTENT_PRIORS, STANDARD_PRIORS, build_priors
from mmcalidet.priors import (PRIOR_KINDS, KindInputs, batch_prior, flat_prior,
                              get_prior_kind, prior_label, register_prior_kind)

K = 4


def test_the_paper_kinds_are_registered_in_table_order():
    assert list(PRIOR_KINDS) == list(
        dict.fromkeys(STANDARD_PRIORS + CONTENT_PRIORS))
    oracle = {name for name, kind in PRIOR_KINDS.items() if kind.oracle}
    assert oracle == {
        'flip_E_x', 'E_v', 'E_b', 'E_x', 'filled_E_x', 'filled_flip_E_x'
    }
    assert prior_label('flip_E_x') == 'flip(E_x)'
    assert prior_label('filled_flip_E_x') == 'filled flip(E_x)'
    assert prior_label('E_t') == 'E_t'
    assert prior_label('site A') == 'site A'  # a user prior's own label
    assert all(kind.note for kind in PRIOR_KINDS.values())


def test_unknown_and_taken_names_are_refused():
    with pytest.raises(KeyError, match="unknown prior kind 'E_q'"):
        get_prior_kind('E_q')
    with pytest.raises(ValueError, match='registered already'):
        register_prior_kind('E_t')
    for bad in ('', 'a=b', None):
        with pytest.raises(ValueError, match='needs a name'):
            register_prior_kind(bad)


def test_a_new_kind_is_found_by_build_priors(monkeypatch):
    registry = dict(PRIOR_KINDS)
    for module in ('mmcalidet.priors.kinds', 'mmcalidet.evaluation.sweep'):
        monkeypatch.setattr(f'{module}.PRIOR_KINDS', registry)

    @register_prior_kind('E_mid', label='mid', note='between E0 and E_t')
    def halfway(inputs: KindInputs) -> np.ndarray:
        return (flat_prior(inputs.num_classes) + inputs.train_prior) / 2

    labels = [np.array([0, 1]), np.array([2])]
    e_t = batch_prior(K, labels)
    spec, = build_priors(['E_mid'], labels, e_t)
    assert (spec.key, spec.label, spec.oracle, spec.note) == \
        ('E_mid', 'mid', False, 'between E0 and E_t')
    np.testing.assert_array_equal(spec.prior, (flat_prior(K) + e_t) / 2)
    assert 'E_mid' not in PRIOR_KINDS  # the module's registry is untouched


def test_kind_inputs_compute_each_image_prior_once():
    inputs = KindInputs([np.array([0]), np.array([1, 2])], flat_prior(K))
    assert inputs.batch_ids == [0, 0]
    assert inputs.per_image is inputs.per_image
    matrices = get_prior_kind('E_x').build(inputs)(np.array([1]))
    assert matrices.shape == (1, K, K) and matrices[0, 1, 2] == 1.0
