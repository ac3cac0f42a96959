# CaliDet (DINO-4scale, ResNet-50) on COCO 2017, the paper's recipe:
# fine-tune the official 12-epoch DINO for 6 epochs (decay after 5) with the
# pre-trained parts at 0.1 x their learning rate and the new CaliFormer at
# the full one; E_t = the shipped COCO train2017 prior is both the
# EdgeSampler's dataset prior and the default deployment prior.
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', '../_base_/calidet.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# the paper's CaliDet parts (../_base_/calidet.py: E_t = COCO train2017,
# the EdgeSampler, CaliFormer, rho, LoMa), with V' = 0 at the start, so the
# fine-tune starts as the baseline (the plain init starts with a
# classification loss 50-140x the DINO's: docs/user_guides/model.md)
califormer = dict(_base_.califormer, zero_init_output=True)

model = dict(
    type='CaliDINO',
    prior=_base_.prior,
    # every weight comes from `load_from`: nothing to download at init
    backbone=dict(init_cfg=None),
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    bbox_head=dict(
        type='CaliDINOHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# The official DINO-4scale R50 12e COCO weights (mmdet's model zoo); pass
# your own path or URL with `--cfg-options load_from=...`. CaliFormer and
# the prior buffer are new: mmengine loads the rest (strict=False) and logs
# them as missing keys.
load_from = 'https://download.openmmlab.com/mmdetection/v3.0/dino/' \
    'dino-4scale_r50_8xb2-12e_coco/' \
    'dino-4scale_r50_8xb2-12e_coco_20221202_182705-55b2bba2.pth'

# DINO's lr is 1e-4 (backbone 1e-5). Pre-trained parts at 0.1 x: base lr
# 1e-5, backbone 1e-6; the new CaliFormer (V and its layers) at 1e-4.
optim_wrapper = dict(
    optimizer=dict(lr=1e-5),
    paramwise_cfg=dict(custom_keys={
        'backbone': dict(lr_mult=0.1),
        'califormer': dict(lr_mult=10.0)
    }))

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

# checkpoints written atomically (a kill never leaves a truncated latest
# checkpoint); per-iteration seeds, so a resumed run repeats the
# uninterrupted one (mmcalidet/engine/checkpoint_hooks.py)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='IterationSeedHook')
                ] + _base_.calidet_custom_hooks
