# The support-aware prior with LoMa on the softmax probabilities, the
# benchmark's two-stage calibrator (`benchmark.py --detector faster-rcnn`):
# chosen over the presence-trained calidet_faster-rcnn_tiny_context-shift_cached.py
# (linear LoMa) by the rule of the project README ("The two-stage
# calibrator's LoMa"). LoMa acts on each positive RoI's target-class
# probability (loma_input='softmax'; bounded, so it cannot trade the box
# head's cross-entropy away as the linear LoMa did), at the paper's weight
# 20; every prior comes with its support and class shares, as for the
# CaliRTMDet (calidet_rtmdet_tiny_context-shift_cached_support.py).
#
#   python tools/train.py \
#       projects/context_shift/configs/calidet_faster-rcnn_tiny_context-shift_cached_support.py \
#       --work-dir work_dirs/context_shift/calidet_faster-rcnn \
#       --cfg-options load_from=work_dirs/context_shift/faster-rcnn/iter_3000.pth
_base_ = [
    './calidet_faster-rcnn_tiny_context-shift_cached.py',
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
    roi_head=dict(
        bbox_head=dict(
            loma_input='softmax',
            loss_loma=dict(type='LoMaLoss', loss_weight=20.0),
            califormer=dict(_base_.califormer,
                            **_base_.support_califormer_options))))
