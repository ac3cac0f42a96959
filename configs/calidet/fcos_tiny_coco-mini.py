# mmdet's FCOS for CPU tests (the baseline of calidet_fcos_tiny_coco-mini.py,
# and so of its calibrator on cached locations): a ResNet-18 (random init)
# with a 128-channel FPN and head on coco-mini with the tiny schedule.
_base_ = [
    'mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

model = dict(
    # random init: nothing to download
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128),
    # coco-mini's images are at most 256 px: a narrower head
    bbox_head=dict(in_channels=128, feat_channels=128, stacked_convs=2))

# data: coco-mini (../_base_/datasets/coco-mini.py)
data_root = _base_.coco_mini_root
train_dataloader = _base_.coco_mini_train_dataloader
val_dataloader = _base_.coco_mini_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.coco_mini_val_evaluator
test_evaluator = val_evaluator

# schedule: ../_base_/schedules/tiny.py, with FCOS's SGD at the lr scaled to
# the batch of 2 (mmdet's 0.01 is for 8 x 2 images)
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
log_processor = _base_.tiny_log_processor
optim_wrapper = dict(optimizer=dict(lr=0.0025))
# per-iteration seeds
custom_hooks = _base_.tiny_custom_hooks
