# The support-aware prior's options, shared by the 10- and 40-class configs
# (calidet_dino_tiny_context-shift[_many-class]_cached_support.py), which
# merge them into their EdgeSampler and CaliFormer:
# - the EdgeSampler attaches each prior's support n (the images each class
#   column was measured on) and class shares, and adds the mode 'sim_site':
#   E_b(n) of a simulated site, n log-uniform in site_support, drawn from a
#   bank of recent training images with class-tilted weights;
# - the CaliFormer's class nodes read [log(1 + n), share] through a
#   zero-initialised map, and its attention adds a zero-initialised multiple
#   of the shrunk lift log((P(i|j) + a) / (P(i) + a)), 0 on any image's E_x.

# the weight of the 'sim_site' mode beside the paper's three
support_mode_weight = 1.0
support_sampler_options = dict(
    support=True, site_support=(1, 256), site_tilt_std=1.0,
    site_bank_size=4096)
support_califormer_options = dict(
    support_features=True, lift_bias=True, lift_shrink=0.05)
