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
_base_ = 'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py'
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# E_t and the default deployment prior (mmcalidet/data/priors/*.json)
prior = 'coco2017_train'

model = dict(
    type='CaliDeformableDETR',
    prior=prior,
    # every weight comes from `load_from`: nothing to download at init
    backbone=dict(init_cfg=None),
    data_preprocessor=dict(batch_augments=[
        dict(
            type='EdgeSampler',
            num_classes=80,
            prior=prior,
            # the supplementary adds E_b(4), E_b over groups of 4 images of
            # the (global) batch, for D-DETR
            mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0, group=1.0),
            group_size=4,
            noise_std=0.16)
    ]),
    bbox_head=dict(
        type='CaliDeformableDETRHead',
        califormer=dict(
            type='CaliFormer',
            num_layers=3,
            num_heads=8,
            feedforward_channels=2048,
            # V' = 0 at the start, so the fine-tune starts as the baseline
            # (the plain init starts with a classification loss 50-140x
            # the DINO's: docs/user_guides/model.md)
            zero_init_output=True),
        rho=0.2,
        loss_loma=dict(type='LoMaLoss', loss_weight=20.0)))

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
custom_hooks = [dict(type='IterationSeedHook')]
