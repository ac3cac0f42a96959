# CaliDet on a two-stage detector for CPU tests and demos: the tiny Faster
# R-CNN of faster-rcnn_tiny_coco-mini.py (ResNet-18, random init, coco-mini,
# the tiny schedule, fewer proposals and sampled RoIs) with the CaliDet
# delta of calidet_faster-rcnn_r50_fpn_1x_coco.py.
_base_ = ['./faster-rcnn_tiny_coco-mini.py', '../_base_/calidet.py']

# the CaliFormer scaled like the tiny DINO's; V' = 0 at the start
califormer = dict(
    _base_.califormer,
    num_layers=1,
    feedforward_channels=512,
    zero_init_output=True)

model = dict(
    type='CaliFasterRCNN',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    roi_head=dict(
        type='CaliStandardRoIHead',
        bbox_head=dict(
            type='CaliShared2FCBBoxHead',
            califormer=califormer,
            rho=_base_.rho,
            loss_loma=_base_.loss_loma)))

# per-iteration seeds, and the named prior matched to the dataset's classes
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
