# mmdet's RTMDet-tiny for CPU tests and benchmarks (the baseline of
# calidet_rtmdet_tiny_coco-mini.py): CSPNeXt with random init and plain BN
# on coco-mini with the tiny schedule.
_base_ = [
    'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

norm_cfg = dict(type='BN')
model = dict(
    # coco-mini's pipelines resize without padding: the batch is padded to
    # a multiple of the largest stride (32), as RTMDet's neck needs
    data_preprocessor=dict(pad_size_divisor=32),
    # random init (nothing to download) and BN, not SyncBN, on one CPU
    backbone=dict(init_cfg=None, norm_cfg=norm_cfg),
    neck=dict(norm_cfg=norm_cfg),
    bbox_head=dict(norm_cfg=norm_cfg))

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
custom_hooks = _base_.tiny_custom_hooks
