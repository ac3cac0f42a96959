# coco-mini for the tiny CPU configs: 80 train2017 + 79 val2017 images with
# their official annotations, resized to at most 256 px, 2 images per batch
# and no worker processes. Folder: $MMCALIDET_DATA/coco-mini (default
# ../shared/datasets, relative to the working directory, i.e. the project
# root); override it with the environment variable, or every dataset path
# with --cfg-options.
#
# Named variables only, so the file can sit beside an mmdet detector config
# (whose data keys it would otherwise duplicate): a config that lists it
# assigns them to the keys mmengine reads,
#
#   data_root = _base_.coco_mini_root
#   img_scale = _base_.coco_mini_img_scale
#   train_pipeline = _base_.coco_mini_train_pipeline
#   test_pipeline = _base_.coco_mini_test_pipeline
#   train_dataloader = _base_.coco_mini_train_dataloader
#   val_dataloader = _base_.coco_mini_val_dataloader
#   test_dataloader = val_dataloader
#   val_evaluator = _base_.coco_mini_val_evaluator
#   test_evaluator = val_evaluator
#
# (the dataloaders and the evaluator are merged into the detector config's
# COCO ones, which give the dataset type and the samplers).
coco_mini_root = '{{$MMCALIDET_DATA:../shared/datasets}}/coco-mini/'
coco_mini_img_scale = (256, 256)
coco_mini_train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=coco_mini_img_scale, keep_ratio=True),
    dict(type='PackDetInputs')
]
coco_mini_test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=coco_mini_img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
coco_mini_train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=coco_mini_root,
        ann_file='reference/instances_train2017_coco-mini.json',
        data_prefix=dict(img='images/train2017/'),
        pipeline=coco_mini_train_pipeline))
coco_mini_val_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=coco_mini_root,
        ann_file='reference/instances_val2017_coco-mini.json',
        data_prefix=dict(img='images/val2017/'),
        pipeline=coco_mini_test_pipeline))
coco_mini_val_evaluator = dict(ann_file=coco_mini_root +
                               'reference/instances_val2017_coco-mini.json')
