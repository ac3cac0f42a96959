# The worked example of docs/user_guides/new_baseline.md: CaliDet on a tiny
# DAB-DETR (mmdet's dab-detr_r50_8xb2-50e_coco.py, scaled like the tiny
# DINO: ResNet-18 with random init, 2 + 2 layers, 30 queries, coco-mini),
# for CPU tests. The CaliDet delta is the DINO recipe's four entries: the
# detector, its prior, the EdgeSampler and the calibrated head.
_base_ = [
    'mmdet::dab_detr/dab-detr_r50_8xb2-50e_coco.py',
    '../_base_/datasets/coco-mini.py', '../_base_/schedules/tiny.py',
    '../_base_/calidet.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

ffn_dims = 512
# the CaliFormer scaled like the tiny transformer (see
# calidet_dino_tiny_coco-mini.py); V' = 0 at the start
califormer = dict(
    _base_.califormer,
    num_layers=1,
    feedforward_channels=ffn_dims,
    zero_init_output=True)

model = dict(
    type='CaliDABDETR',
    prior=_base_.prior,
    num_queries=30,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    test_cfg=dict(max_per_img=30),
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[512]),
    encoder=dict(
        num_layers=2,
        layer_cfg=dict(ffn_cfg=dict(feedforward_channels=ffn_dims))),
    decoder=dict(
        num_layers=2,
        layer_cfg=dict(ffn_cfg=dict(feedforward_channels=ffn_dims))),
    bbox_head=dict(
        type='CaliDABDETRHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# data: coco-mini (../_base_/datasets/coco-mini.py)
data_root = _base_.coco_mini_root
train_dataloader = _base_.coco_mini_train_dataloader
val_dataloader = _base_.coco_mini_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.coco_mini_val_evaluator
test_evaluator = val_evaluator

# schedule: ../_base_/schedules/tiny.py, with DAB-DETR's optimizer
train_cfg = _base_.tiny_train_cfg
param_scheduler = _base_.tiny_param_scheduler
default_hooks = _base_.tiny_default_hooks
log_processor = _base_.tiny_log_processor
# per-iteration seeds, and the named prior matched to the dataset's classes
custom_hooks = _base_.tiny_custom_hooks + _base_.calidet_custom_hooks
