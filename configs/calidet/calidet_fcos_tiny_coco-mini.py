# CaliDet on FCOS for CPU tests and the worked example of
# docs/user_guides/new_baseline.md ("a new one-stage family in one adapter
# and one head class"): the tiny FCOS of fcos_tiny_coco-mini.py (ResNet-18,
# random init, a 128-channel head, coco-mini, the tiny schedule) with the
# CaliDet delta. CaliFCOSHead calibrates FCOS's one 3 x 3 classification
# conv, shared by the levels, at its kernel's centre.
_base_ = ['./fcos_tiny_coco-mini.py', '../_base_/calidet.py']

# the CaliFormer scaled like the tiny DINO's; V' = 0 at the start
califormer = dict(
    _base_.califormer,
    num_layers=1,
    feedforward_channels=512,
    zero_init_output=True)

model = dict(
    type='CaliFCOS',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    bbox_head=dict(
        type='CaliFCOSHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# per-iteration seeds, and the named prior matched to the dataset's classes
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
