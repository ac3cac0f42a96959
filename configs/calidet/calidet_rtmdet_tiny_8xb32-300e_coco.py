# CaliDet on a one-stage detector: RTMDet-tiny on COCO 2017 with mmdet's
# 300-epoch recipe (mosaic, mix-up, EMA, the pipeline switch at epoch 280).
# The CaliDet delta is the DINO recipe's four entries: the detector, its
# prior, the EdgeSampler and the calibrated head (CaliRTMDetHead: the
# levels' 1 x 1 classification convs are W_l + rho V', one CaliFormer for
# all levels, LoMa on the assigned class of the positive locations).
_base_ = [
    'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py', '../_base_/calidet.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# V' = 0 at the start: the calibrated head starts as RTMDet's
califormer = dict(_base_.califormer, zero_init_output=True)

model = dict(
    type='CaliRTMDet',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    bbox_head=dict(
        type='CaliRTMDetHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# RTMDet's hooks (EMA, the pipeline switch) and the named prior matched to
# the dataset's classes
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
