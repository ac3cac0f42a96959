# CaliDet on a one-stage detector for CPU tests and demos: the tiny RTMDet
# of rtmdet_tiny_coco-mini.py (RTMDet-tiny, random init, BN, coco-mini, the
# tiny schedule) with the CaliDet delta of
# calidet_rtmdet_tiny_8xb32-300e_coco.py.
_base_ = ['./rtmdet_tiny_coco-mini.py', '../_base_/calidet.py']

# the CaliFormer scaled like the tiny DINO's; V' = 0 at the start
califormer = dict(
    _base_.califormer,
    num_layers=1,
    feedforward_channels=512,
    zero_init_output=True)

model = dict(
    type='CaliRTMDet',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    bbox_head=dict(
        type='CaliRTMDetHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# per-iteration seeds, and the named prior matched to the dataset's classes
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
