# The support-aware prior on the CaliRTMDet, the benchmark's one-stage
# calibrator (`benchmark.py --detector rtmdet`, with 10,000 CaliFormer
# updates at either budget): chosen over the presence-trained
# calidet_rtmdet_tiny_context-shift_cached.py by the rule of the project
# README ("The one-stage calibrator's updates"). The options of the
# 10-class CaliDINO's calibrator (calidet_dino_tiny_context-shift_cached_support.py,
# _base_/support_prior.py) on the RTMDet's cached dense locations: every
# prior comes with its support and class shares, the CaliFormer reads them
# and the shrunk lift, and the EdgeSampler adds the 'sim_site' mode.
#
#   python tools/train.py \
#       projects/context_shift/configs/calidet_rtmdet_tiny_context-shift_cached_support.py \
#       --work-dir work_dirs/context_shift/calidet_rtmdet \
#       --cfg-options load_from=work_dirs/context_shift/rtmdet/iter_3000.pth
_base_ = [
    './calidet_rtmdet_tiny_context-shift_cached.py',
    './_base_/support_prior.py'
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
