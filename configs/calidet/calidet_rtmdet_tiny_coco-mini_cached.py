# The tiny CaliRTMDet of calidet_rtmdet_tiny_coco-mini.py calibrated on
# cached locations of a trained tiny RTMDet (rtmdet_tiny_coco-mini.py):
# only the CaliFormer learns. Set the RTMDet:
#   python tools/train.py \
#       configs/calidet/calidet_rtmdet_tiny_coco-mini_cached.py \
#       --cfg-options load_from=RTMDET.pth
# load_from names the baseline once: tools/train.py makes the cache from it
# (the dataset's source.checkpoint) and refuses two detectors. Per image the
# cache holds the classification features of the assigner's positive
# locations and of sampled negative ones, with their targets
# (mmcalidet/decoder_cache/dense.py; docs/user_guides/calibrate.md).
_base_ = ['./calidet_rtmdet_tiny_coco-mini.py', '../_base_/calibrator.py']

load_from = 'work_dirs/rtmdet_tiny_coco-mini/iter_400.pth'

# V' = 0 at the start: the calibrator starts as the baseline it calibrates
califormer = dict(_base_.califormer, zero_init_output=True)
model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor,
    bbox_head=dict(califormer=califormer))

# 256 px images have 1,344 locations over RTMDet's three levels: every
# positive and a sample of the negatives up to 512 per image, the sampled
# negatives weighted up so the loss sums stay unbiased
train_dataloader = dict(
    _base_.calibrator_dataloader,
    batch_size=2,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/rtmdet_tiny_coco-mini/dense_cache_train',
        source=dict(
            config='configs/calidet/rtmdet_tiny_coco-mini.py',
            passes=2,
            num_locations=512)))
# the CaliFormer alone at the calibrator's lr (2e-4, ../_base_/calibrator.py):
# RTMDet's 4e-3 trains a whole detector from scratch
optim_wrapper = _base_.calibrator_optim_wrapper
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
