# CaliDet on a two-stage detector for CPU tests and demos: mmdet's Faster
# R-CNN with a ResNet-18 (random init) on coco-mini with the tiny schedule,
# fewer proposals and sampled RoIs. The CaliDet delta is that of
# calidet_faster-rcnn_r50_fpn_1x_coco.py.
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
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

model = dict(
    type='CaliFasterRCNN',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    # random init: nothing to download
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]),
    roi_head=dict(
        type='CaliStandardRoIHead',
        bbox_head=dict(
            type='CaliShared2FCBBoxHead',
            califormer=califormer,
            rho=_base_.rho,
            loss_loma=_base_.loss_loma)),
    # coco-mini's images are at most 256 px: fewer proposals and RoIs
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300)))

# data: coco-mini (../_base_/datasets/coco-mini.py)
data_root = _base_.coco_mini_root
train_dataloader = _base_.coco_mini_train_dataloader
val_dataloader = _base_.coco_mini_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.coco_mini_val_evaluator
test_evaluator = val_evaluator

# schedule: ../_base_/schedules/tiny.py, with Faster R-CNN's SGD at the lr
# scaled to the batch of 2 (mmdet's 0.02 is for 8 x 2 images)
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
log_processor = _base_.tiny_log_processor
optim_wrapper = dict(optimizer=dict(lr=0.0025))
# per-iteration seeds, and the named prior matched to the dataset's classes
custom_hooks = _base_.tiny_custom_hooks + _base_.calidet_custom_hooks
