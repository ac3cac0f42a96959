# The context-shift CaliDINO calibrated on cached decoder outputs: the
# trained plain DINO runs once over the training set (every decoder layer's
# hidden states and boxes are cached), then only the CaliFormer learns, from
# the cache, with the paper's losses (focal loss on the calibrated logits
# with Hungarian matching, LoMa) and a prior drawn by the EdgeSampler at
# every step. The trunk, the box branches and W, b stay the DINO's, so the
# checkpoint is a normal CaliDINO checkpoint (init_detector,
# inference_detector(prior=...), tools/test.py and every evaluation tool
# load it with this config or calidet_dino_tiny_context-shift.py).
#
#   python tools/train.py \
#       configs/context_shift/calidet_dino_tiny_context-shift_cached.py \
#       --work-dir work_dirs/context_shift/calidet_cached
#
# A cached step costs a few ms where a full CaliDINO step costs about 0.5 s
# on 2 CPU cores (benchmarks/bench_cached_calibrator.py), so the CaliFormer
# gets 10-100x the updates of the 1,000-iteration fine-tune.
_base_ = './calidet_dino_tiny_context-shift.py'

dino_config = 'configs/context_shift/dino_tiny_context-shift.py'
dino_checkpoint = 'work_dirs/context_shift/dino/iter_3000.pth'
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
        # made on first use (one pass of the DINO over the 2,000 train
        # scenes, about a minute), remade when the checkpoint changes
        cache_dir='work_dirs/context_shift/dino/decoder_cache_train',
        source=dict(
            config=dino_config, checkpoint=dino_checkpoint, passes=1)))

# 10,000 CaliFormer updates (10x the fine-tune's), lr x0.1 at 5/6; the
# CaliFormer learns at 2e-4 (base lr 2e-5 x10, as in the fine-tune)
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
# only the CaliFormer gets gradients: the rest of the model is unused by
# the loss (multi-process training must not wait for its gradients)
model_wrapper_cfg = dict(
    type='MMDistributedDataParallel', find_unused_parameters=True)
# the optimizer holds the CaliFormer only (the frozen trunk would cost
# hundreds of empty parameter groups per step) and updates its tensors with
# torch's fused AdamW (CPU too: 1.9 ms per step for the 1.6M parameters of
# the 3-layer CaliFormer, against 6.5 ms one tensor at a time); it learns at
# 2e-4, the fine-tune's CaliFormer lr
optim_wrapper = dict(
    constructor='CalibratorOptimWrapperConstructor',
    optimizer=dict(lr=2e-4, fused=True),
    paramwise_cfg=dict(_delete_=True))
