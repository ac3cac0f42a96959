# Candidate B of "The two-stage calibrator's LoMa" (project README): the
# CaliFasterRCNN's calibrator with LoMa on the target class's softmax
# probability (prob_loma.py), at the paper's weight 20 (bounded, it cannot
# run away as the linear LoMa did at 20).
#
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   python projects/context_shift/tools/benchmark.py --detector faster-rcnn ... \
#       --calibrator-config projects/context_shift/experiments/bounded_loma/calidet_faster-rcnn_tiny_context-shift_cached_prob-loma.py
_base_ = ['../../configs/calidet_faster-rcnn_tiny_context-shift_cached.py']
custom_imports = dict(
    _base_.custom_imports,
    imports=_base_.custom_imports.imports +
    ['projects.context_shift.experiments.bounded_loma.prob_loma'])

model = dict(
    roi_head=dict(
        bbox_head=dict(
            type='ProbLoMaShared2FCBBoxHead',
            loss_loma=dict(type='LoMaLoss', loss_weight=20.0))))
