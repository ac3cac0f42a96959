# The calibrator training on cached decoder outputs, as named variables (see
# calidet.py for why fragments hold variables): a CaliDet config whose
# CaliFormer learns alone from a trained baseline's cached decoder outputs
# lists this beside its CaliDet base and assigns them, e.g.
#
#   _base_ = ['./calidet_dino_tiny_coco-mini.py', '../_base_/calibrator.py']
#   model = dict(
#       type=_base_.calibrator_model_type,
#       detector=_base_.model.type,
#       data_preprocessor=_base_.calibrator_preprocessor)
#   train_dataloader = dict(
#       _base_.calibrator_dataloader,
#       dataset=dict(type='DecoderCacheDataset', cache_dir=..., source=...))
#   optim_wrapper = _base_.calibrator_optim_wrapper
#   model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
#
# (user guide: docs/user_guides/calibrate.md)

# the model: the CaliDet detector of the config's base, whose loss takes
# the cached decoder outputs (same modules and checkpoints), e.g.
#   model = dict(type=_base_.calibrator_model_type, detector='CaliDINO')
calibrator_model_type = 'CachedCalibration'

# batches cached outputs (and still images, for testing and inference)
calibrator_preprocessor = dict(type='DecoderCachePreprocessor')

# the cached outputs replace the image pipeline; the config adds its
# DecoderCacheDataset as `dataset`
calibrator_dataloader = dict(
    _delete_=True,
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True))

# the optimizer holds the CaliFormer only (the frozen trunk would cost
# hundreds of empty parameter groups per step) and updates its tensors with
# torch's fused AdamW (CPU too: 1.9 ms per step for the 1.6M parameters of
# the 3-layer CaliFormer, against 6.5 ms one tensor at a time); 2e-4 is the
# fine-tune's CaliFormer lr
calibrator_optim_wrapper = dict(
    constructor='CalibratorOptimWrapperConstructor',
    optimizer=dict(lr=2e-4, fused=True),
    paramwise_cfg=dict(_delete_=True))

# only the CaliFormer gets gradients: the rest of the model is unused by
# the loss (multi-process training must not wait for its gradients)
calibrator_model_wrapper_cfg = dict(
    type='MMDistributedDataParallel', find_unused_parameters=True)

# the context-shift schedule: 10,000 CaliFormer updates (10x the
# fine-tune's), lr x0.1 at 5/6
calibrator_max_iters = 10000
calibrator_train_cfg = dict(
    max_iters=calibrator_max_iters, val_interval=calibrator_max_iters)
calibrator_param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=calibrator_max_iters,
        by_epoch=False,
        milestones=[8333],
        gamma=0.1)
]
calibrator_default_hooks = dict(
    logger=dict(interval=500),
    checkpoint=dict(interval=calibrator_max_iters, max_keep_ckpts=1))

# the COCO schedule (calidet/*-cached_coco.py): 100k updates of 8 GPUs x 2
# (a cached step is a small fraction of a full one; the 6-epoch fine-tune
# makes 6 x 7,330 = 44k updates), lr x0.1 at 5/6, a checkpoint every 10k
calibrator_coco_max_iters = 100000
calibrator_coco_train_cfg = dict(
    _delete_=True,
    type='PromptIterBasedTrainLoop',
    max_iters=calibrator_coco_max_iters,
    val_interval=calibrator_coco_max_iters)
calibrator_coco_param_scheduler = [
    dict(
        calibrator_param_scheduler[0],
        end=calibrator_coco_max_iters,
        milestones=[83333])
]
calibrator_coco_default_hooks = dict(
    checkpoint=dict(by_epoch=False, interval=10000, max_keep_ckpts=2),
    logger=dict(interval=500))
