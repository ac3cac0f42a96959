# The tiny CaliFCOS of calidet_fcos_tiny_coco-mini.py calibrated on cached
# locations of a trained tiny FCOS (fcos_tiny_coco-mini.py): only the
# CaliFormer learns. Set the FCOS:
#   python tools/train.py \
#       configs/calidet/calidet_fcos_tiny_coco-mini_cached.py \
#       --cfg-options load_from=FCOS.pth
# Per image the cache holds the classification conv's input over its 3 x 3
# kernel (128 x 9 values) at the positive locations and at sampled negative
# ones, with their labels (mmcalidet/decoder_cache/dense.py,
# mmcalidet/models/head_kinds/fcos.py).
_base_ = ['./calidet_fcos_tiny_coco-mini.py', '../_base_/calibrator.py']

load_from = 'work_dirs/fcos_tiny_coco-mini/iter_400.pth'

# V' = 0 at the start: the calibrator starts as the baseline it calibrates
califormer = dict(_base_.califormer, zero_init_output=True)
model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor,
    bbox_head=dict(califormer=califormer))

# 256 px images have 1,364 locations over FCOS's five levels: every
# positive and a sample of the negatives up to 512 per image, the sampled
# negatives weighted up so the loss sums stay unbiased
train_dataloader = dict(
    _base_.calibrator_dataloader,
    batch_size=2,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/fcos_tiny_coco-mini/dense_cache_train',
        source=dict(
            config='configs/calidet/fcos_tiny_coco-mini.py',
            passes=2,
            num_locations=512)))
optim_wrapper = _base_.calibrator_optim_wrapper
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
