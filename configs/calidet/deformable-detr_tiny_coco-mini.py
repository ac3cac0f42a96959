# A tiny plain single-scale Deformable DETR on coco-mini for CPU tests: the
# paper's D-DETR variant (one feature level, C5) shrunk like
# dino_tiny_coco-mini.py: ResNet-18 (random init, nothing downloaded), 2
# encoder and 2 decoder layers with a small FFN, 30 queries, images of at
# most 256 px. It is the baseline twin of
# calidet_deformable-detr_tiny_coco-mini.py (same budget).
#
# Data: $MMCALIDET_DATA/coco-mini (default ../shared/datasets, relative to
# the working directory, i.e. the project root); the data and schedule
# fragments of dino_tiny_coco-mini.py.
_base_ = [
    'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py'
]
# the CPU's deformable attention by mmcalidet's compiled kernel
# (mmcalidet/models/layers/cpu_deform_attn.py)
custom_imports = dict(
    imports=[
        'mmcalidet.engine.checkpoint_hooks',
        'mmcalidet.models.layers.enable_cpu_deform_attn'
    ],
    allow_failed_imports=False)

ffn_dims = 512

model = dict(
    num_queries=30,
    num_feature_levels=1,
    backbone=dict(depth=18, out_indices=(3, ), init_cfg=None),
    neck=dict(in_channels=[512], num_outs=1),
    encoder=dict(
        num_layers=2,
        layer_cfg=dict(
            self_attn_cfg=dict(num_levels=1),
            ffn_cfg=dict(feedforward_channels=ffn_dims))),
    decoder=dict(
        num_layers=2,
        layer_cfg=dict(
            cross_attn_cfg=dict(num_levels=1),
            ffn_cfg=dict(feedforward_channels=ffn_dims))),
    test_cfg=dict(max_per_img=30))

# data: coco-mini (../_base_/datasets/coco-mini.py)
data_root = _base_.coco_mini_root
img_scale = _base_.coco_mini_img_scale
train_pipeline = _base_.coco_mini_train_pipeline
test_pipeline = _base_.coco_mini_test_pipeline
train_dataloader = _base_.coco_mini_train_dataloader
val_dataloader = _base_.coco_mini_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.coco_mini_val_evaluator
test_evaluator = val_evaluator

# schedule: 400 iterations, atomic checkpoints, per-iteration seeds
# (../_base_/schedules/tiny.py); the optimizer stays the detector's
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
custom_hooks = _base_.tiny_custom_hooks
log_processor = _base_.tiny_log_processor
