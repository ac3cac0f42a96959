# CaliDet on a two-stage detector: Faster R-CNN (ResNet-50, FPN) on COCO
# 2017 with mmdet's 1x recipe. The CaliDet delta is the DINO recipe's four
# entries: the detector, its prior, the EdgeSampler and the calibrated head
# (CaliShared2FCBBoxHead: the box head's classifier fc_cls is W + rho V' on
# the K class logits, the background logit uncalibrated, LoMa on the target
# class of the sampled positive RoIs), plus the RoI head that hands the box
# head each RoI's image (per-image priors) and the data samples (LoMa).
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', '../_base_/calidet.py'
]
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# V' = 0 at the start: the calibrated box head starts as Faster R-CNN's
califormer = dict(_base_.califormer, zero_init_output=True)

model = dict(
    type='CaliFasterRCNN',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    roi_head=dict(
        type='CaliStandardRoIHead',
        bbox_head=dict(
            type='CaliShared2FCBBoxHead',
            califormer=califormer,
            rho=_base_.rho,
            loss_loma=_base_.loss_loma)))

# the named prior matched to the dataset's classes (mmdet's Faster R-CNN
# recipe has no custom hooks)
custom_hooks = _base_.calidet_custom_hooks
