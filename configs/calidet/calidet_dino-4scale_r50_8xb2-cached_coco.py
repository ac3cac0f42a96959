# CaliDet (DINO-4scale, ResNet-50) on COCO 2017, calibrator only: the
# official 12-epoch DINO runs once over (a part of) train2017 and caches
# every decoder layer's hidden states and boxes; then only the CaliFormer
# learns from the cache, with the paper's losses (focal loss on the
# calibrated logits with Hungarian matching, LoMa on every decoder layer)
# and the paper's edge sampling. The trunk, the box branches and W, b stay
# the DINO's. Not the paper's recipe (a 6-epoch fine-tune of everything,
# calidet_dino-4scale_r50_8xb2-6e_coco.py): no denoising queries and no
# encoder loss in the calibrator's loss, neither of which depends on E.
#
#   # 1. the cache (one pass of the DINO; GPUs make it in minutes)
#   python tools/analysis_tools/cache_decoder_outputs.py \
#       mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py DINO.pth \
#       --out data/coco/decoder_cache_train --num-images 20000 \
#       --dtype float16 --device cuda
#   # 2. the calibrator
#   python tools/train.py \
#       configs/calidet/calidet_dino-4scale_r50_8xb2-cached_coco.py \
#       --cfg-options load_from=DINO.pth
#
# Cache size: 6 layers x 900 queries x (256 + 4) values per image, 2.8 MB
# in float16: 20,000 images take 56 GB of disk (read through memory maps);
# all of train2017 would take 330 GB. More images cost disk, not time per
# update.
_base_ = [
    './calidet_dino-4scale_r50_8xb2-6e_coco.py', '../_base_/calibrator.py'
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
        type='DecoderCacheDataset', cache_dir='data/coco/decoder_cache_train'))

# the CaliFormer alone, at the paper's CaliFormer lr (1e-4)
optim_wrapper = dict(
    _base_.calibrator_optim_wrapper,
    optimizer=dict(_base_.calibrator_optim_wrapper.optimizer, lr=1e-4))

# 100k updates of 8 GPUs x 2, lr x0.1 at 5/6 (_base_/calibrator.py)
train_cfg = _base_.calibrator_coco_train_cfg
param_scheduler = _base_.calibrator_coco_param_scheduler
default_hooks = _base_.calibrator_coco_default_hooks
log_processor = dict(by_epoch=False)
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
