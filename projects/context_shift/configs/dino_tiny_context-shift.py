# The tiny plain DINO on the context-shift benchmark (10 digit classes,
# 128 px scenes). Generate the data first:
#   python projects/context_shift/tools/make_data.py \
#       --out data/context_shift --seed 0
# Data folder: $MMCALIDET_CS_DATA (default data/context_shift, relative to
# the project root).
_base_ = [
    '../../../configs/calidet/dino_tiny_coco-mini.py',
    './_base_/context_shift_schedule.py'
]

cs_root = '{{$MMCALIDET_CS_DATA:data/context_shift}}/'
classes = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven',
           'eight', 'nine')
metainfo = dict(classes=classes)
img_scale = (128, 128)

# the backbone learns from scratch here (nothing is downloaded): no frozen
# stem, batch-norm statistics updated, full learning rate
model = dict(
    backbone=dict(
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False),
    bbox_head=dict(num_classes=10))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    dataset=dict(
        data_root=cs_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='images/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(
        data_root=cs_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='images/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=cs_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# schedule (2 CPU cores: 0.53-0.9 s per iteration, 27-45 minutes in all):
# 3000 iterations of 4 images (6 passes over the 2000 train scenes), lr
# 2e-4 decayed x0.1 at 2500. The CaliDINO twin fine-tunes from iter_2000
# for the last 1000 iterations, so both see the same 3000 iterations.
# AdamW's fused kernel (the same update in one call instead of a Python loop
# over ~185 tensors) saved 7-22 % of a step in alternating runs on 2 CPU
# cores; it needs torch >= 2.4 on the CPU.
train_dataloader.update(batch_size=4)
optim_wrapper = dict(
    optimizer=dict(lr=2e-4, fused=True),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=1.0)}))
# (_base_/context_shift_schedule.py, shared with the RTMDet and the Faster
# R-CNN)
max_iters = _base_.cs_max_iters
train_cfg = _base_.cs_train_cfg
param_scheduler = _base_.cs_param_scheduler
default_hooks = _base_.cs_default_hooks
