# The context-shift calibrator with the paper's recipe at the paper's
# per-class LoMa weight: LoMa on every class logit of every matching query
# (the paper's), E_x / E_b / E_t drawn equally with sigma 0.16 (the
# paper's), and gamma = 20 * K / 80. LoMaLoss averages its term over the
# K classes, so the paper's gamma 20 at K = 80 weighs each class 0.25; at
# K = 10 the same per-class weight is gamma 2.5 (gamma 20 here would weigh
# each class 8x the paper's and costs 11-25 AP at E_t, docs/results.md).
# 10,000 CaliFormer updates, lr x0.1 at 5/6 (the cached default's
# schedule). Measured on three data seeds in docs/results.md ("The paper's
# recipe at its per-class LoMa weight" and the full-length section): on
# the 900-iteration DINOs the largest E0 -> E_x gain of the recipes there
# (+14 to +17 AP), but E0 falls to about flip(E_x) and the crossed site's
# prior loses about 6 AP; on the 3,000-iteration DINO the paper's whole
# order holds, 2.5 AP under the DINO at E_t. Not the default.
#
#   python tools/train.py \
#       projects/context_shift/configs/calidet_dino_tiny_context-shift_cached_paper.py \
#       --work-dir work_dirs/context_shift/calidet_paper
_base_ = './calidet_dino_tiny_context-shift_cached.py'

loss_loma = dict(_base_.loss_loma, loss_weight=20.0 * 10 / 80)
model = dict(bbox_head=dict(loma_queries='all', loss_loma=loss_loma))
