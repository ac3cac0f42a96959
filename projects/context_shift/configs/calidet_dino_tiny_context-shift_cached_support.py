# The support-aware prior, the 10-class benchmark's calibrator (chosen over
# the presence-trained calidet_dino_tiny_context-shift_cached.py by the rule
# of the project README, "Relation-reading candidates"): every
# prior comes with its support n (the images each class column was measured
# on: 1 for an image's E_x, the site size for E_b(n)) and each class's share
# of those images. The CaliFormer's class nodes read [log(1 + n), share]
# through a zero-initialised linear map, and its attention adds a learnable,
# zero-initialised multiple of the shrunk lift log((P(i|j) + a) / (P(i) + a)),
# which is 0 on any single image's prior. The EdgeSampler adds a fourth
# mode, 'sim_site': E_b(n) of a simulated site, n from 1 to 256
# (log-uniform) recent training images drawn with class-tilted weights, so
# that fractional priors carry label information with a strength that grows
# with n. Everything else is
# the default recipe (calidet_dino_tiny_context-shift_cached.py); the options
# are in _base_/support_prior.py, shared with the 40-class config.
#
#   python tools/train.py \
#       projects/context_shift/configs/calidet_dino_tiny_context-shift_cached_support.py \
#       --work-dir work_dirs/context_shift/calidet_cached_support
_base_ = [
    './calidet_dino_tiny_context-shift_cached.py', './_base_/support_prior.py'
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
