# The CaliDet delta: the parts that make a DETR detector calibratable, with
# the paper's values (Sec. 4.1: a 3-layer CaliFormer, rho = 0.2, LoMa
# gamma = 20, edge noise N(0, 0.16^2)), as named variables. It sets none of
# the keys mmengine reads: a CaliDet config lists it beside its detector's
# base and builds `model` from these pieces, e.g.
#
#   _base_ = ['mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
#             '../_base_/calidet.py']
#   model = dict(
#       type='CaliDINO',
#       prior=_base_.prior,
#       data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
#       bbox_head=dict(
#           type='CaliDINOHead',
#           califormer=_base_.califormer,
#           rho=_base_.rho,
#           loss_loma=_base_.loss_loma))
#
# A config that changes a piece rebinds its name (e.g.
# `califormer = dict(_base_.califormer, num_layers=1)`) and builds `model`
# from the new one, so the variables of the merged config describe its
# model. None of the names is a key of mmdet's DINO or Deformable DETR
# configs, so this file can sit beside them as a sibling base.
# calidet_deformable-detr.py adds the supplementary's D-DETR sampler.

# E_t: the EdgeSampler's dataset prior and the detector's default
# deployment prior (a prior file or a shipped name,
# mmcalidet/data/priors/*.json): COCO train2017, K = 80
prior = 'coco2017_train'

# CaliFormer (Eq. califormer): 3 layers of attention over the K class nodes
# V, biased by the prior
califormer = dict(
    type='CaliFormer', num_layers=3, num_heads=8, feedforward_channels=2048)

# the scale of V' in the calibrated classifier W + rho V' (Eq.
# prediction-head)
rho = 0.2

# LoMa, L_LoMa = gamma sum_j L_j / K
loss_loma = dict(type='LoMaLoss', loss_weight=20.0)

# the EdgeSampler (a batch augment of the data preprocessor) draws each
# image's training prior: E_x (the image's own statistics), E_b (the
# mini-batch's) or E_t, one random edge perturbed by N(0, 0.16^2). Its K
# and E_t are the detector's (the head's num_classes and model.prior, filled
# in when the detector is built), so a config states them once
edge_sampler = dict(
    type='EdgeSampler',
    mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0),
    noise_std=0.16)

# the training dataset's classes reach the model before training, so a named
# prior (a file or shipped name that records its classes) is reordered to
# the dataset's class order (mmengine's runner never sets the model's
# dataset_meta); a CaliDet config adds them to its hooks:
#   custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
calidet_custom_hooks = [dict(type='PriorClassesHook')]
