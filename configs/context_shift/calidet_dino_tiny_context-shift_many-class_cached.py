# The many-class CaliDINO calibrated on cached decoder outputs of the
# many-class DINO: calidet_dino_tiny_context-shift_many-class.py with the
# calibrator training of calidet_dino_tiny_context-shift_cached.py (see
# there; mmengine cannot merge the two as sibling bases, so the block is
# repeated).
_base_ = './calidet_dino_tiny_context-shift_many-class.py'

dino_config = 'configs/context_shift/dino_tiny_context-shift_many-class.py'
dino_checkpoint = 'work_dirs/context_shift_many-class/dino/iter_3000.pth'
load_from = dino_checkpoint

model = dict(data_preprocessor=dict(type='DecoderCachePreprocessor'))

train_dataloader = dict(
    _delete_=True,
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/context_shift_many-class/dino/'
        'decoder_cache_train',
        source=dict(
            config=dino_config, checkpoint=dino_checkpoint, passes=1)))

max_iters = 10000
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        milestones=[8333],
        gamma=0.1)
]
default_hooks = dict(
    logger=dict(interval=500),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1))
model_wrapper_cfg = dict(
    type='MMDistributedDataParallel', find_unused_parameters=True)
optim_wrapper = dict(
    constructor='CalibratorOptimWrapperConstructor',
    optimizer=dict(lr=2e-4, fused=True),
    paramwise_cfg=dict(_delete_=True))
