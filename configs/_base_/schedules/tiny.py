# The tiny CPU configs' schedule: 400 iterations (40 iterations = one pass
# over coco-mini's 80 train images at 2 per batch), validation and a
# checkpoint every 200, lr x0.1 at 300; the learning rate and optimizer stay
# the detector's. Checkpoints are written atomically (a kill never leaves a
# truncated latest checkpoint); with per-iteration seeds
# (IterationSeedHook) a resumed run repeats the uninterrupted one
# (mmcalidet/engine/checkpoint_hooks.py).
#
# Named variables only, so the file can sit beside an mmdet detector config
# (whose schedule keys it would otherwise duplicate): a config that lists it
# assigns them,
#
#   train_cfg = _base_.tiny_train_cfg
#   param_scheduler = _base_.tiny_param_scheduler
#   default_hooks = _base_.tiny_default_hooks
#   custom_hooks = _base_.tiny_custom_hooks
#   log_processor = _base_.tiny_log_processor
#
# (`_delete_` drops the detector's epoch-based loop settings). A config
# inheriting such a config changes `max_iters` and restates what depends on
# it.
max_iters = 400
tiny_train_cfg = dict(
    _delete_=True,
    type='PromptIterBasedTrainLoop',
    max_iters=max_iters,
    val_interval=200)
tiny_param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        milestones=[300],
        gamma=0.1)
]
tiny_default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(
        type='AtomicCheckpointHook',
        by_epoch=False,
        interval=200,
        max_keep_ckpts=1))
tiny_custom_hooks = [dict(type='IterationSeedHook')]
tiny_log_processor = dict(by_epoch=False)
