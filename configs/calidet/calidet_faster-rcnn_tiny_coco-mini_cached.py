# The tiny CaliFasterRCNN of calidet_faster-rcnn_tiny_coco-mini.py
# calibrated on cached RoIs of a trained tiny Faster R-CNN
# (faster-rcnn_tiny_coco-mini.py): only the CaliFormer learns. Set the
# Faster R-CNN:
#   python tools/train.py \
#       configs/calidet/calidet_faster-rcnn_tiny_coco-mini_cached.py \
#       --cfg-options load_from=FASTER_RCNN.pth
# load_from names the baseline once: tools/train.py makes the cache from it
# (the dataset's source.checkpoint) and refuses two detectors. Per image the
# cache holds the box head's classification features (the input of fc_cls)
# of the RoIs the training sampler drew, with their labels and label
# weights (mmcalidet/decoder_cache/roi.py; docs/user_guides/calibrate.md).
_base_ = ['./calidet_faster-rcnn_tiny_coco-mini.py', '../_base_/calibrator.py']

load_from = 'work_dirs/faster-rcnn_tiny_coco-mini/iter_400.pth'

model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor)

# the sampler's 128 RoIs per image (train_cfg.rcnn.sampler.num), each pass
# a new draw of proposals' samples
train_dataloader = dict(
    _base_.calibrator_dataloader,
    batch_size=2,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/faster-rcnn_tiny_coco-mini/roi_cache_train',
        source=dict(
            config='configs/calidet/faster-rcnn_tiny_coco-mini.py',
            passes=2,
            num_locations=128)))
# the CaliFormer alone at the calibrator's lr (2e-4, ../_base_/calibrator.py)
# with AdamW, as every calibrator: the Faster R-CNN's SGD at that lr would
# leave a transformer barely trained
optim_wrapper = dict(
    _base_.calibrator_optim_wrapper,
    optimizer=dict(
        _delete_=True, type='AdamW', lr=2e-4, weight_decay=1e-4,
        fused=True))
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
