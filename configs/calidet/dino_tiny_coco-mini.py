# A tiny plain DINO on coco-mini for CPU tests and the overhead benchmark:
# ResNet-18 (random init, nothing downloaded), 2 encoder and 2 decoder layers
# with a small FFN, 30 queries, images of at most 256 px. (The width stays
# 256: mmdet's DINO decoder hard-codes 128 sine features per coordinate.)
# It is the baseline twin of calidet_dino_tiny_coco-mini.py (same budget).
#
# Data: $MMCALIDET_DATA/coco-mini (default ../shared/datasets, relative to
# the working directory, i.e. the project root), see
# ../_base_/datasets/coco-mini.py; schedule: ../_base_/schedules/tiny.py.
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
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

# the detector's AdamW, one parameter group per distinct setting instead of
# mmengine's one per parameter (the same updates in fewer calls;
# mmcalidet/engine/merged_groups_optim.py); with a fused AdamW the gradient
# clipping runs inside its step (mmcalidet/engine/fused_clip_optim.py)
optim_wrapper = dict(
    type='FusedClipOptimWrapper',
    constructor='MergedGroupsOptimWrapperConstructor')

# schedule: 400 iterations, atomic checkpoints, per-iteration seeds
# (../_base_/schedules/tiny.py); the optimizer stays the detector's
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
custom_hooks = _base_.tiny_custom_hooks
log_processor = _base_.tiny_log_processor
