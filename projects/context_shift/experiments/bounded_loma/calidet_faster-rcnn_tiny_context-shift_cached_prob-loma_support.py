# Candidate C of "The two-stage calibrator's LoMa" (project README): LoMa
# on the softmax probability (candidate B) with the support-aware prior
# (_base_/support_prior.py), the recipe that won on the CaliRTMDet.
_base_ = [
    './calidet_faster-rcnn_tiny_context-shift_cached_prob-loma.py',
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
    roi_head=dict(
        bbox_head=dict(
            califormer=dict(_base_.califormer,
                            **_base_.support_califormer_options))))
