# CaliDet on the tiny single-scale Deformable DETR of
# deformable-detr_tiny_coco-mini.py (same model, data and budget):
# CaliDeformableDETR + CaliDeformableDETRHead (CaliFormer, rho, LoMa) +
# EdgeSampler with the supplementary's extra E_b(4) edges.
_base_ = [
    './deformable-detr_tiny_coco-mini.py',
    '../_base_/calidet_deformable-detr.py'
]
# the CPU's deformable attention by mmcalidet's compiled kernel
# (mmcalidet/models/layers/cpu_deform_attn.py)
custom_imports = dict(
    imports=[
        'mmcalidet',
        'mmcalidet.engine.checkpoint_hooks',
        'mmcalidet.models.layers.enable_cpu_deform_attn'
    ],
    allow_failed_imports=False)

# the CaliFormer scaled like the tiny transformer (see
# calidet_dino_tiny_coco-mini.py); the rest as
# ../_base_/calidet_deformable-detr.py
califormer = dict(_base_.califormer, num_layers=1, feedforward_channels=512)

model = dict(
    type='CaliDeformableDETR',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler_group4]),
    bbox_head=dict(
        type='CaliDeformableDETRHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# matches the named prior to the dataset's classes before training
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
