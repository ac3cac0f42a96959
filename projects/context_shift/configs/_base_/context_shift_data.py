# The 10-class context-shift data as named variables (128 px scenes, the
# benchmark's folder $MMCALIDET_CS_DATA, default data/context_shift), for a
# detector config that lists this file beside its own (whose data keys it
# would otherwise duplicate) and assigns them:
#
#   train_dataloader = _base_.cs_train_dataloader
#   val_dataloader = _base_.cs_val_dataloader
#   test_dataloader = val_dataloader
#   val_evaluator = _base_.cs_val_evaluator
#   test_evaluator = val_evaluator
#
# The same data settings as dino_tiny_context-shift.py (the DINO's own copy).
cs_root = '{{$MMCALIDET_CS_DATA:data/context_shift}}/'
cs_classes = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven',
              'eight', 'nine')
cs_metainfo = dict(classes=cs_classes)
cs_img_scale = (128, 128)
cs_train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=cs_img_scale, keep_ratio=True),
    dict(type='PackDetInputs')
]
cs_test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=cs_img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
cs_train_dataloader = dict(
    batch_size=4,
    dataset=dict(
        data_root=cs_root,
        metainfo=cs_metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='images/'),
        pipeline=cs_train_pipeline))
cs_val_dataloader = dict(
    dataset=dict(
        data_root=cs_root,
        metainfo=cs_metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='images/'),
        pipeline=cs_test_pipeline))
cs_val_evaluator = dict(ann_file=cs_root + 'annotations/instances_val.json')
