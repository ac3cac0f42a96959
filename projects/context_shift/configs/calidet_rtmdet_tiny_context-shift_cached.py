# The context-shift CaliRTMDet calibrated on cached locations of the trained
# plain RTMDet (rtmdet_tiny_context-shift.py), as
# calidet_dino_tiny_context-shift_cached.py does for the DINO: the RTMDet
# runs over the training scenes once per pass (the classification features
# of the assigner's positive locations and of sampled negatives, with their
# targets: mmcalidet/decoder_cache/dense.py), then only the CaliFormer
# learns, with the benchmark's train statistics as E_t and default prior.
# The trunk and the heads stay the RTMDet's, so the checkpoint is a normal
# CaliRTMDet checkpoint.
#
#   python tools/train.py \
#       projects/context_shift/configs/calidet_rtmdet_tiny_context-shift_cached.py \
#       --work-dir work_dirs/context_shift/calidet_rtmdet \
#       --cfg-options load_from=work_dirs/context_shift/rtmdet/iter_3000.pth
# (projects/context_shift/tools/benchmark.py --detector rtmdet runs it all.)
_base_ = [
    '../../../configs/calidet/calidet_rtmdet_tiny_coco-mini_cached.py',
    './_base_/context_shift_data.py', './_base_/rtmdet_size.py'
]

rtmdet_config = 'projects/context_shift/configs/rtmdet_tiny_context-shift.py'
# the baseline, named once: tools/train.py makes the cache from it
load_from = 'work_dirs/context_shift/rtmdet/iter_3000.pth'

metainfo = _base_.cs_metainfo
prior = '{{$MMCALIDET_CS_DATA:data/context_shift}}/priors/E_t.json'
# the RTMDet's size (_base_/rtmdet_size.py), with the CaliRTMDet's parts
model = dict(
    prior=prior,
    backbone=_base_.cs_rtmdet_backbone,
    neck=_base_.cs_rtmdet_neck,
    bbox_head=_base_.cs_rtmdet_head,
    test_cfg=_base_.cs_rtmdet_test_cfg)

# 128 px scenes have 336 locations over RTMDet's three levels: all cached
train_dataloader = dict(
    dataset=dict(
        cache_dir='work_dirs/context_shift/rtmdet/dense_cache_train',
        source=dict(config=rtmdet_config, passes=1, num_locations=336)))
val_dataloader = _base_.cs_val_dataloader
test_dataloader = val_dataloader
val_evaluator = _base_.cs_val_evaluator
test_evaluator = val_evaluator

# the calibrator schedule of configs/_base_/calibrator.py (10,000 CaliFormer
# updates, x0.1 at 5/6), as the DINO's calibrator
max_iters = _base_.calibrator_max_iters
train_cfg = _base_.calibrator_train_cfg
param_scheduler = _base_.calibrator_param_scheduler
default_hooks = _base_.calibrator_default_hooks
