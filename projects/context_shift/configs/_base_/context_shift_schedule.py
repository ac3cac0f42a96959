# The context-shift detectors' schedule as named variables, for a plain
# detector config that lists this file beside its own (the DINO's, the
# RTMDet's, the Faster R-CNN's): 3000 iterations of 4 images, lr x0.1 at
# 2500, a checkpoint every 1000. The benchmark sets its own (--dino-iters).
# A config assigns them:
#
#   train_cfg = _base_.cs_train_cfg
#   param_scheduler = _base_.cs_param_scheduler
#   default_hooks = _base_.cs_default_hooks
cs_max_iters = 3000
cs_train_cfg = dict(max_iters=cs_max_iters, val_interval=1000)
cs_param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=cs_max_iters,
        by_epoch=False,
        milestones=[2500],
        gamma=0.1)
]
cs_default_hooks = dict(
    logger=dict(interval=50), checkpoint=dict(interval=1000, max_keep_ckpts=3))
