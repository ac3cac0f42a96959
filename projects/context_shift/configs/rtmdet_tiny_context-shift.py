# The tiny plain RTMDet on the context-shift benchmark (10 digit classes,
# 128 px scenes): the one-stage baseline of
# `projects/context_shift/tools/benchmark.py --detector rtmdet`, the
# RTMDet-tiny of configs/calidet/rtmdet_tiny_coco-mini.py (random init, BN,
# RTMDet's AdamW at 4e-3), narrowed (_base_/rtmdet_size.py), on the data of
# dino_tiny_context-shift.py (_base_/context_shift_data.py). Data folder:
# $MMCALIDET_CS_DATA (default data/context_shift).
#   python tools/train.py \
#       projects/context_shift/configs/rtmdet_tiny_context-shift.py \
#       --work-dir work_dirs/context_shift/rtmdet
_base_ = [
    '../../../configs/calidet/rtmdet_tiny_coco-mini.py',
    './_base_/context_shift_data.py', './_base_/rtmdet_size.py',
    './_base_/context_shift_schedule.py'
]

# RTMDet-tiny narrowed for the 128 px scenes (_base_/rtmdet_size.py)
model = dict(
    backbone=_base_.cs_rtmdet_backbone,
    neck=_base_.cs_rtmdet_neck,
    bbox_head=_base_.cs_rtmdet_head,
    test_cfg=_base_.cs_rtmdet_test_cfg)

train_dataloader = _base_.cs_train_dataloader
val_dataloader = _base_.cs_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.cs_val_evaluator
test_evaluator = val_evaluator

# schedule: the DINO's length (3000 iterations of 4 images, lr x0.1 at
# 2500); the benchmark sets its own (--dino-iters)
max_iters = _base_.cs_max_iters
train_cfg = _base_.cs_train_cfg
param_scheduler = _base_.cs_param_scheduler
default_hooks = _base_.cs_default_hooks
