# The context-shift CaliDINO calibrated on cached decoder outputs, on the
# paper's edge distribution (presence-trained; the 10-class benchmark's
# default until the support-aware prior, *_cached_support.py, which
# inherits this config, was chosen over it: project README): the
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
#       projects/context_shift/configs/calidet_dino_tiny_context-shift_cached.py \
#       --work-dir work_dirs/context_shift/calidet_cached
#
# A cached step costs a few ms where a full CaliDINO step costs about 0.5 s
# on 2 CPU cores (benchmarks/bench_cached_calibrator.py), so the CaliFormer
# gets 10-100x the updates of the 1,000-iteration fine-tune.
_base_ = [
    './calidet_dino_tiny_context-shift.py',
    '../../../configs/_base_/calibrator.py'
]

dino_config = 'projects/context_shift/configs/dino_tiny_context-shift.py'
# the baseline, named once: tools/train.py makes the cache from it
load_from = 'work_dirs/context_shift/dino/iter_3000.pth'

model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor)

train_dataloader = dict(
    _base_.calibrator_dataloader,
    dataset=dict(
        type='DecoderCacheDataset',
        # made on first use (one pass of the DINO over the 2,000 train
        # scenes, about a minute), remade when the checkpoint changes
        cache_dir='work_dirs/context_shift/dino/decoder_cache_train',
        source=dict(config=dino_config, passes=1)))

# the calibrator schedule, optimizer and wrapper of ../_base_/calibrator.py:
# 10,000 CaliFormer updates at 2e-4 (the fine-tune's CaliFormer lr), x0.1
# at 5/6, fused AdamW over the CaliFormer only
max_iters = _base_.calibrator_max_iters
train_cfg = _base_.calibrator_train_cfg
param_scheduler = _base_.calibrator_param_scheduler
default_hooks = _base_.calibrator_default_hooks
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
optim_wrapper = _base_.calibrator_optim_wrapper
