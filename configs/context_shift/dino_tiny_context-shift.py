# The tiny plain DINO on the context-shift benchmark (10 digit classes,
# 128 px scenes). Generate the data first:
#   python tools/dataset_converters/make_context_shift.py \
#       --out data/context_shift --seed 0
# Data folder: $MMCALIDET_CS_DATA (default data/context_shift, relative to
# the project root).
_base_ = '../calidet/dino_tiny_coco-mini.py'

cs_root = '{{$MMCALIDET_CS_DATA:data/context_shift}}/'
classes = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven',
           'eight', 'nine')
metainfo = dict(classes=classes)
img_scale = (128, 128)

model = dict(bbox_head=dict(num_classes=10))

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
