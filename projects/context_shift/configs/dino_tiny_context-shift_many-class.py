# The tiny plain DINO on the many-class context-shift variant: 40 classes
# (10 digits x 4 colour styles), 2-4 of them per image, so class statistics
# look like COCO's (docs/user_guides/context_shift.md). Only the classes and
# the data folder differ from dino_tiny_context-shift.py. Generate the data
# first:
#   python projects/context_shift/tools/make_data.py \
#       --out data/context_shift_many-class --variant many-class --seed 0
# Data folder: $MMCALIDET_CS_DATA (default data/context_shift_many-class,
# relative to the project root).
_base_ = './dino_tiny_context-shift.py'

cs_root = '{{$MMCALIDET_CS_DATA:data/context_shift_many-class}}/'
# context_shift.data.variant_classes('many-class') (projects/context_shift)
classes = ('zero_red', 'one_red', 'two_red', 'three_red', 'four_red',
           'five_red', 'six_red', 'seven_red', 'eight_red', 'nine_red',
           'zero_orange', 'one_orange', 'two_orange', 'three_orange',
           'four_orange', 'five_orange', 'six_orange', 'seven_orange',
           'eight_orange', 'nine_orange',
           'zero_green', 'one_green', 'two_green', 'three_green', 'four_green',
           'five_green', 'six_green', 'seven_green', 'eight_green',
           'nine_green',
           'zero_blue', 'one_blue', 'two_blue', 'three_blue', 'four_blue',
           'five_blue', 'six_blue', 'seven_blue', 'eight_blue', 'nine_blue')
metainfo = dict(classes=classes)

model = dict(bbox_head=dict(num_classes=40))

train_dataloader = dict(dataset=dict(data_root=cs_root, metainfo=metainfo))
val_dataloader = dict(dataset=dict(data_root=cs_root, metainfo=metainfo))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=cs_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
