# The context-shift Faster R-CNN's size and settings, as named variables
# shared by the plain Faster R-CNN (faster-rcnn_tiny_context-shift.py) and
# its CaliFasterRCNN calibrator
# (calidet_faster-rcnn_tiny_context-shift_cached.py), which list this file
# beside their own and merge them into `model`. The tiny Faster R-CNN of
# configs/calidet/faster-rcnn_tiny_coco-mini.py (ResNet-18, random init)
# for 128 px scenes of 14-22 px digits on 2 CPU cores: the backbone learns
# from scratch (BN updated, no frozen stem, as the context-shift DINO's), a
# 64-channel FPN and RPN, anchors of 16 px at stride 4 (mmdet's 32 px at
# scale 8 are larger than most digits), 256-wide box-head FCs, 10 classes.
cs_frcnn_backbone = dict(
    frozen_stages=-1,
    norm_cfg=dict(type='BN', requires_grad=True),
    norm_eval=False)
cs_frcnn_neck = dict(out_channels=64)
cs_frcnn_rpn_head = dict(
    in_channels=64, feat_channels=64, anchor_generator=dict(scales=[4]))
cs_frcnn_roi_head = dict(
    bbox_roi_extractor=dict(out_channels=64),
    bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=10))
# test: 100 detections an image (COCO's maxDets)
cs_frcnn_test_cfg = dict(rcnn=dict(max_per_img=100))
