# CaliDINO twin of dino_tiny_context-shift_many-class.py: the recipe of
# calidet_dino_tiny_context-shift.py on the many-class variant (40 classes,
# 2-4 per image; docs/user_guides/context_shift.md). Only the classes, the
# data folder (and with it E_t) and the head's K (the EdgeSampler takes it)
# differ.
#   python tools/train.py \
#       projects/context_shift/configs/dino_tiny_context-shift_many-class.py \
#       --work-dir work_dirs/context_shift_many-class/dino
#   python tools/train.py \
#       projects/context_shift/configs/calidet_dino_tiny_context-shift_many-class.py \
#       --work-dir work_dirs/context_shift_many-class/calidet
_base_ = './calidet_dino_tiny_context-shift.py'

cs_root = '{{$MMCALIDET_CS_DATA:data/context_shift_many-class}}/'
# context_shift.data.variant_classes('many-class') (projects/context_shift)
classes = ('zero_red', 'one_red', 'two_red', 'three_red', 'four_red',
           'five_red', 'six_red', 'seven_red', 'eight_red', 'nine_red',
           'zero_orange', 'one_orange', 'two_orange', 'three_orange',
           'four_orange', 'five_orange', 'six_orange', 'seven_orange',
           'eight_orange', 'nine_orange', 'zero_green', 'one_green',
           'two_green', 'three_green', 'four_green', 'five_green', 'six_green',
           'seven_green', 'eight_green', 'nine_green', 'zero_blue', 'one_blue',
           'two_blue', 'three_blue', 'four_blue', 'five_blue', 'six_blue',
           'seven_blue', 'eight_blue', 'nine_blue')
metainfo = dict(classes=classes)
prior = cs_root + 'priors/E_t.json'
# the EdgeSampler takes K = 40 and this E_t from the detector
model = dict(prior=prior, bbox_head=dict(num_classes=40))

load_from = 'work_dirs/context_shift_many-class/dino/iter_3000.pth'

train_dataloader = dict(dataset=dict(data_root=cs_root, metainfo=metainfo))
val_dataloader = dict(dataset=dict(data_root=cs_root, metainfo=metainfo))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=cs_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
