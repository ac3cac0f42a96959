# CaliDet on single-scale Deformable DETR (ResNet-50 C5 only), the variant
# of the paper's supplementary ("Porting to D-DETR"): the multi-scale
# CaliDet config with one feature level.
#
# mmdet ships no single-scale Deformable DETR weights: train the baseline
# with deformable-detr-ss_r50_16xb2-50e_coco.py first, then fine-tune its
# last checkpoint with this config (`load_from` below, or
# `--cfg-options load_from=...`).
_base_ = './calidet_deformable-detr_r50_8xb2-6e_coco.py'

model = dict(
    num_feature_levels=1,
    backbone=dict(out_indices=(3, )),
    neck=dict(in_channels=[2048], num_outs=1),
    encoder=dict(layer_cfg=dict(self_attn_cfg=dict(num_levels=1))),
    decoder=dict(layer_cfg=dict(cross_attn_cfg=dict(num_levels=1))))

load_from = 'work_dirs/deformable-detr-ss_r50_16xb2-50e_coco/epoch_50.pth'
