# CaliDet on a one-stage detector for CPU tests and demos: mmdet's
# RTMDet-tiny (CSPNeXt with random init and plain BN) on coco-mini with the
# tiny schedule. The CaliDet delta is that of
# calidet_rtmdet_tiny_8xb32-300e_coco.py.
_base_ = [
    'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py',
    '../_base_/calidet.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# the CaliFormer scaled like the tiny DINO's; V' = 0 at the start
califormer = dict(
    _base_.califormer,
    num_layers=1,
    feedforward_channels=512,
    zero_init_output=True)

norm_cfg = dict(type='BN')
model = dict(
    type='CaliRTMDet',
    prior=_base_.prior,
    # coco-mini's pipelines resize without padding: the batch is padded to
    # a multiple of the largest stride (32), as RTMDet's neck needs
    data_preprocessor=dict(
        pad_size_divisor=32, batch_augments=[_base_.edge_sampler]),
    # random init (nothing to download) and BN, not SyncBN, on one CPU
    backbone=dict(init_cfg=None, norm_cfg=norm_cfg),
    neck=dict(norm_cfg=norm_cfg),
    bbox_head=dict(
        type='CaliRTMDetHead',
        norm_cfg=norm_cfg,
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# data: coco-mini (../_base_/datasets/coco-mini.py)
data_root = _base_.coco_mini_root
train_dataloader = _base_.coco_mini_train_dataloader
val_dataloader = _base_.coco_mini_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.coco_mini_val_evaluator
test_evaluator = val_evaluator

# schedule: ../_base_/schedules/tiny.py, with RTMDet's optimizer; no EMA
# and no pipeline switch (coco-mini's pipeline has no mosaic)
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
log_processor = _base_.tiny_log_processor
custom_hooks = _base_.tiny_custom_hooks + _base_.calidet_custom_hooks
