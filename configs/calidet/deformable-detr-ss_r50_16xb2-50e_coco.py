# The single-scale Deformable DETR baseline (ResNet-50 C5 only) of the
# paper's supplementary: mmdet's Deformable DETR recipe with one feature
# level. mmdet ships multi-scale weights only; train this one to fine-tune
# calidet_deformable-detr-ss_r50_8xb2-6e_coco.py from it.
_base_ = 'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py'
custom_imports = dict(
    imports=['mmcalidet.engine.checkpoint_hooks'], allow_failed_imports=False)

model = dict(
    num_feature_levels=1,
    backbone=dict(out_indices=(3, )),
    neck=dict(in_channels=[2048], num_outs=1),
    encoder=dict(layer_cfg=dict(self_attn_cfg=dict(num_levels=1))),
    decoder=dict(layer_cfg=dict(cross_attn_cfg=dict(num_levels=1))))

default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='IterationSeedHook')]
