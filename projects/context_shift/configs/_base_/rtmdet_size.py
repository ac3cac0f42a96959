# The context-shift RTMDet's size and test settings, as named variables shared by the plain
# RTMDet (rtmdet_tiny_context-shift.py) and its CaliRTMDet calibrator
# (calidet_rtmdet_tiny_context-shift_cached.py), which list this file beside
# their own and merge them into `model`. RTMDet-tiny narrowed for 128 px
# scenes of 10 classes on 2 CPU cores: CSPNeXt at widen 0.25 (64-256
# channels), a 64-channel neck and head, one conv per head tower; about 2.1 M
# parameters instead of 4.9 M, a training step about 4x faster
# (0.9 s instead of 4.2 s for 4 images on 2 busy CPU cores).
cs_rtmdet_backbone = dict(widen_factor=0.25)
cs_rtmdet_neck = dict(in_channels=[64, 128, 256], out_channels=64)
cs_rtmdet_head = dict(
    num_classes=10, in_channels=64, feat_channels=64, stacked_convs=1)
# test: the 300 best (location, class) pairs of each level enter the NMS, 100
# detections an image (COCO's maxDets) instead of mmdet's 30,000 and 300: the
# NMS of every pair was most of a re-scoring's cost (AP at E_t unchanged on
# the demo's data-seed-0 models).
cs_rtmdet_test_cfg = dict(nms_pre=300, max_per_img=100)
