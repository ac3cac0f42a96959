# The tiny CaliDeformableDETR of calidet_deformable-detr_tiny_coco-mini.py
# calibrated on cached decoder outputs of a trained tiny Deformable DETR
# (deformable-detr_tiny_coco-mini.py): only the CaliFormer learns, as in
# calidet_dino_tiny_coco-mini_cached.py. Set the Deformable DETR:
#   python tools/train.py \
#       configs/calidet/calidet_deformable-detr_tiny_coco-mini_cached.py \
#       --cfg-options load_from=DDETR.pth
# load_from names the baseline once: tools/train.py makes the decoder cache
# from it (the dataset's source.checkpoint) and refuses two detectors.
_base_ = [
    './calidet_deformable-detr_tiny_coco-mini.py', '../_base_/calibrator.py'
]

load_from = 'work_dirs/deformable-detr_tiny_coco-mini/iter_400.pth'

# V' = 0 at the start: the calibrator starts as the baseline it calibrates
# (docs/user_guides/model.md)
califormer = dict(_base_.califormer, zero_init_output=True)
model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor,
    bbox_head=dict(califormer=califormer))

train_dataloader = dict(
    _base_.calibrator_dataloader,
    batch_size=2,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/deformable-detr_tiny_coco-mini/'
        'decoder_cache_train',
        source=dict(
            config='configs/calidet/deformable-detr_tiny_coco-mini.py',
            passes=2)))
# the CaliFormer alone (../_base_/calibrator.py)
optim_wrapper = _base_.calibrator_optim_wrapper
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
