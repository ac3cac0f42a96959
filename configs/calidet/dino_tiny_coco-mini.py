# A tiny plain DINO on coco-mini for CPU tests and the overhead benchmark:
# ResNet-18 (random init, nothing downloaded), 2 encoder and 2 decoder layers
# with a small FFN, 30 queries, images of at most 256 px. (The width stays
# 256: mmdet's DINO decoder hard-codes 128 sine features per coordinate.)
# It is the baseline twin of calidet_dino_tiny_coco-mini.py (same budget).
#
# Data: $MMCALIDET_DATA/coco-mini (default ../shared/datasets, relative to
# the working directory, i.e. the project root). Override the folder with the
# environment variable, or every dataset path with --cfg-options.
_base_ = 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'
custom_imports = dict(
    imports=['mmcalidet.engine.checkpoint_hooks'], allow_failed_imports=False)

ffn_dims = 512

model = dict(
    num_queries=30,
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[128, 256, 512]),
    encoder=dict(
        num_layers=2,
        layer_cfg=dict(ffn_cfg=dict(feedforward_channels=ffn_dims))),
    decoder=dict(
        num_layers=2,
        layer_cfg=dict(ffn_cfg=dict(feedforward_channels=ffn_dims))),
    dn_cfg=dict(group_cfg=dict(num_dn_queries=20)),
    test_cfg=dict(max_per_img=30))

# data: coco-mini (80 train2017 + 79 val2017 images, official annotations)
data_root = '{{$MMCALIDET_DATA:../shared/datasets}}/coco-mini/'
img_scale = (256, 256)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
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
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        ann_file='reference/instances_train2017_coco-mini.json',
        data_prefix=dict(img='images/train2017/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        ann_file='reference/instances_val2017_coco-mini.json',
        data_prefix=dict(img='images/val2017/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root +
                     'reference/instances_val2017_coco-mini.json')
test_evaluator = val_evaluator

# schedule: iteration based (40 iterations = one pass over the 80 images)
max_iters = 400
train_cfg = dict(
    _delete_=True,
    type='IterBasedTrainLoop',
    max_iters=max_iters,
    val_interval=200)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        milestones=[300],
        gamma=0.1)
]
# checkpoints written atomically (a kill never leaves a truncated latest
# checkpoint); per-iteration seeds, so a resumed run repeats the
# uninterrupted one (mmcalidet/engine/checkpoint_hooks.py)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(
        type='AtomicCheckpointHook',
        by_epoch=False,
        interval=200,
        max_keep_ckpts=1))
custom_hooks = [dict(type='IterationSeedHook')]
log_processor = dict(by_epoch=False)
