# The tiny CaliDINO of calidet_dino_tiny_coco-mini.py calibrated on cached
# decoder outputs of a trained tiny DINO (dino_tiny_coco-mini.py): only the
# CaliFormer learns (see projects/context_shift/configs/
# calidet_dino_tiny_context-shift_cached.py for the recipe). Set the DINO:
#   python tools/train.py \
#       configs/calidet/calidet_dino_tiny_coco-mini_cached.py \
#       --cfg-options load_from=DINO.pth
# load_from names the baseline once: tools/train.py makes the decoder cache
# from it (the dataset's source.checkpoint) and refuses two detectors.
_base_ = ['./calidet_dino_tiny_coco-mini.py', '../_base_/calibrator.py']

load_from = 'work_dirs/dino_tiny_coco-mini/iter_400.pth'

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
        cache_dir='work_dirs/dino_tiny_coco-mini/decoder_cache_train',
        source=dict(config='configs/calidet/dino_tiny_coco-mini.py',
                    passes=2)))
# the CaliFormer alone, at the tiny schedule's lr (../_base_/calibrator.py)
optim_wrapper = dict(
    _base_.calibrator_optim_wrapper, optimizer=dict(fused=True))
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
