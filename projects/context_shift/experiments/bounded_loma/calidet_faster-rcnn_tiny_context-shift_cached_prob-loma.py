# Candidate B of "The two-stage calibrator's LoMa" (project README), not
# chosen: the CaliFasterRCNN's presence-trained calibrator with LoMa on the
# target class's softmax probability (loma_input='softmax') at the paper's
# weight 20 (bounded, it cannot run away as the linear LoMa did at 20). Its
# AP(E_t) fell 0.58 under the Faster R-CNN's (the rule's margin: 0.5); the
# same with the support-aware prior won
# (../../configs/calidet_faster-rcnn_tiny_context-shift_cached_support.py).
#
#   python projects/context_shift/tools/benchmark.py --detector faster-rcnn ... \
#       --calibrator-config projects/context_shift/experiments/bounded_loma/calidet_faster-rcnn_tiny_context-shift_cached_prob-loma.py
_base_ = ['../../configs/calidet_faster-rcnn_tiny_context-shift_cached.py']

model = dict(
    roi_head=dict(
        bbox_head=dict(
            loma_input='softmax',
            loss_loma=dict(type='LoMaLoss', loss_weight=20.0))))
