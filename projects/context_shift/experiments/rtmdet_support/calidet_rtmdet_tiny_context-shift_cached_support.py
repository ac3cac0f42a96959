# A candidate calibrator of the CaliRTMDet (projects/context_shift/README.md,
# "Choosing a training recipe", the one-stage candidates): the support-aware
# prior that the CaliDINO uses on 10 classes
# (calidet_dino_tiny_context-shift_cached_support.py), on the RTMDet's cached
# dense locations. Run by
#   python projects/context_shift/tools/benchmark.py --detector rtmdet \
#       --calibrator-config projects/context_shift/experiments/rtmdet_support/calidet_rtmdet_tiny_context-shift_cached_support.py ...
_base_ = [
    '../../configs/calidet_rtmdet_tiny_context-shift_cached.py',
    '../../configs/_base_/support_prior.py'
]

model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _base_.edge_sampler,
            mode_probs=dict(
                _base_.edge_sampler.mode_probs,
                sim_site=_base_.support_mode_weight),
            **_base_.support_sampler_options)
    ]),
    bbox_head=dict(
        califormer=dict(_base_.califormer,
                        **_base_.support_califormer_options)))
