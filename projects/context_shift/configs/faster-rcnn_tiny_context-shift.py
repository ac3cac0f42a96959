# The tiny plain Faster R-CNN on the context-shift benchmark (10 digit
# classes, 128 px scenes): the two-stage baseline of
# `projects/context_shift/tools/benchmark.py --detector faster-rcnn`, the
# Faster R-CNN of configs/calidet/faster-rcnn_tiny_coco-mini.py (ResNet-18,
# random init) sized for the scenes (_base_/faster_rcnn_size.py), on the data
# of dino_tiny_context-shift.py (_base_/context_shift_data.py). Data folder:
# $MMCALIDET_CS_DATA (default data/context_shift).
#   python tools/train.py \
#       projects/context_shift/configs/faster-rcnn_tiny_context-shift.py \
#       --work-dir work_dirs/context_shift/faster-rcnn
_base_ = [
    '../../../configs/calidet/faster-rcnn_tiny_coco-mini.py',
    './_base_/context_shift_data.py', './_base_/faster_rcnn_size.py',
    './_base_/context_shift_schedule.py'
]

model = dict(
    backbone=_base_.cs_frcnn_backbone,
    neck=_base_.cs_frcnn_neck,
    rpn_head=_base_.cs_frcnn_rpn_head,
    roi_head=_base_.cs_frcnn_roi_head,
    test_cfg=_base_.cs_frcnn_test_cfg)

train_dataloader = _base_.cs_train_dataloader
val_dataloader = _base_.cs_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.cs_val_evaluator
test_evaluator = val_evaluator

# schedule: the DINO's length (3000 iterations of 4 images, lr x0.1 at
# 2500); the benchmark sets its own (--dino-iters). The backbone learns
# from scratch: AdamW at the context-shift DINO's 2e-4 instead of mmdet's
# SGD for a pretrained one.
optim_wrapper = dict(
    optimizer=dict(
        _delete_=True, type='AdamW', lr=2e-4, weight_decay=1e-4,
        fused=True))
max_iters = _base_.cs_max_iters
train_cfg = _base_.cs_train_cfg
param_scheduler = _base_.cs_param_scheduler
default_hooks = _base_.cs_default_hooks
