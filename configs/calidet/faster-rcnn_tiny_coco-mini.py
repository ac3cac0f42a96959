# mmdet's Faster R-CNN for CPU tests and benchmarks (the baseline and the
# base of calidet_faster-rcnn_tiny_coco-mini.py, and so of its calibrator on
# cached RoIs): a ResNet-18 (random init) on coco-mini with the tiny
# schedule, fewer proposals and sampled RoIs.
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

model = dict(
    # random init: nothing to download
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]),
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
# per-iteration seeds
custom_hooks = _base_.tiny_custom_hooks
