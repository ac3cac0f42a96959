# CaliDet on multi-scale Deformable DETR (ResNet-50) on COCO 2017: mmdet's
# Deformable DETR config, unchanged but for what CaliDet needs (the
# calibratable detector and head, the EdgeSampler, the fine-tuning
# schedule). The paper's supplementary ports CaliDet to the single-scale
# variant: calidet_deformable-detr-ss_r50_8xb2-6e_coco.py inherits this file.
#
# The recipe is the paper's for DINO: fine-tune the baseline for 6 epochs
# (decay after 5), pre-trained parts at 0.1 x their learning rate, the new
# CaliFormer at the full one, on 8 GPUs x 2 images (see
# docs/user_guides/train.md); E_t = the shipped COCO train2017 prior.
_base_ = [
    'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
    '../_base_/calidet_deformable-detr.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# the paper's CaliDet parts with the supplementary's E_b(4) edges for
# D-DETR (../_base_/calidet_deformable-detr.py), and V' = 0 at the start,
# so the fine-tune starts as the baseline (the plain init starts with a
# classification loss 50-140x the DINO's: docs/user_guides/model.md)
califormer = dict(_base_.califormer, zero_init_output=True)

model = dict(
    type='CaliDeformableDETR',
    prior=_base_.prior,
    # every weight comes from `load_from`: nothing to download at init
    backbone=dict(init_cfg=None),
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler_group4]),
    bbox_head=dict(
        type='CaliDeformableDETRHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# mmdet's Deformable DETR R50 50e COCO weights; pass your own path or URL
# with `--cfg-options load_from=...`. CaliFormer and the prior buffer are
# new: they are reported as missing keys and keep their initialisation.
load_from = 'https://download.openmmlab.com/mmdetection/v3.0/' \
    'deformable_detr/deformable-detr_r50_16xb2-50e_coco/' \
    'deformable-detr_r50_16xb2-50e_coco_20221029_210934-6bc7d21b.pth'

# Deformable DETR's lr is 2e-4 (backbone, sampling offsets and reference
# points 0.1 x). Pre-trained parts at 0.1 x: base lr 2e-5; the CaliFormer
# (V and its layers) at 2e-4. The base's other lr_mult keys stay.
optim_wrapper = dict(
    optimizer=dict(lr=2e-5),
    paramwise_cfg=dict(custom_keys={'califormer': dict(lr_mult=10.0)}))

max_epochs = 6
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[5],
        gamma=0.1)
]
# the learning rates are for the base's batch of 32 (16 GPUs x 2 images);
# on 8 GPUs x 2, `--auto-scale-lr` halves them (auto_scale_lr)

# checkpoints written atomically (a kill never leaves a truncated latest
# checkpoint); per-iteration seeds, so a resumed run repeats the
# uninterrupted one
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='IterationSeedHook')
                ] + _base_.calidet_custom_hooks
