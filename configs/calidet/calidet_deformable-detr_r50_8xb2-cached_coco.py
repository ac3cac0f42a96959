# CaliDet on multi-scale Deformable DETR (ResNet-50) on COCO 2017,
# calibrator only: the trained Deformable DETR runs once over (a part of)
# train2017 and caches every decoder layer's hidden states and boxes; then
# only the CaliFormer learns from the cache, with the paper's losses (focal
# loss on the calibrated logits with Hungarian matching, LoMa on every
# decoder layer) and the supplementary's edge sampling for D-DETR (E_b(4)
# edges). The trunk, the box branches and W, b stay the baseline's. Not the
# fine-tune of calidet_deformable-detr_r50_8xb2-6e_coco.py: no encoder loss
# (two-stage variants) in the calibrator's loss; it does not depend on E.
#
#   # 1. the cache (one pass of the baseline; GPUs make it in minutes)
#   python tools/analysis_tools/cache_decoder_outputs.py \
#       mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py \
#       DDETR.pth \
#       --out data/coco/ddetr_decoder_cache_train --num-images 20000 \
#       --dtype float16 --device cuda
#   # 2. the calibrator
#   python tools/train.py \
#       configs/calidet/calidet_deformable-detr_r50_8xb2-cached_coco.py \
#       --cfg-options load_from=DDETR.pth
#
# Cache size: 6 layers x 300 queries x (256 + 4) values per image, 0.94 MB
# in float16: 20,000 images take 19 GB of disk (read through memory maps).
# The single-scale variant: inherit this file and set the model keys of
# calidet_deformable-detr-ss_r50_8xb2-6e_coco.py and its `load_from`.
_base_ = [
    './calidet_deformable-detr_r50_8xb2-6e_coco.py',
    '../_base_/calibrator.py'
]

model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor)

train_dataloader = dict(
    _base_.calibrator_dataloader,
    batch_size=2,  # per GPU, as the paper's mini-batches (E_b over 2)
    num_workers=2,
    persistent_workers=True,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='data/coco/ddetr_decoder_cache_train'))

# the CaliFormer alone, at the fine-tune's CaliFormer lr: 2e-4 for the
# base's batch of 32, which `--auto-scale-lr` halves on 8 GPUs x 2
optim_wrapper = _base_.calibrator_optim_wrapper

# 100k updates of 8 GPUs x 2, lr x0.1 at 5/6 (_base_/calibrator.py)
train_cfg = _base_.calibrator_coco_train_cfg
param_scheduler = _base_.calibrator_coco_param_scheduler
default_hooks = _base_.calibrator_coco_default_hooks
log_processor = dict(by_epoch=False)
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
