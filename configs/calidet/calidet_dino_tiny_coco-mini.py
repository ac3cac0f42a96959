# CaliDet on the tiny DINO of dino_tiny_coco-mini.py (same model, data and
# budget): CaliDINO + CaliDINOHead (CaliFormer, rho, LoMa) + EdgeSampler.
_base_ = ['./dino_tiny_coco-mini.py', '../_base_/calidet.py']
# the CPU's deformable attention by mmcalidet's compiled kernel
# (mmcalidet/models/layers/cpu_deform_attn.py)
custom_imports = dict(
    imports=[
        'mmcalidet',
        'mmcalidet.engine.checkpoint_hooks',
        'mmcalidet.models.layers.enable_cpu_deform_attn'
    ],
    allow_failed_imports=False)

# the paper's CaliDet parts (../_base_/calidet.py: E_t = COCO train2017,
# the EdgeSampler, rho, LoMa) with the CaliFormer scaled like the tiny
# transformer (1/3 of DINO's depth, 1/4 of its FFN width): the paper's has 3
# layers and a 2048 FFN
califormer = dict(_base_.califormer, num_layers=1, feedforward_channels=512)

model = dict(
    type='CaliDINO',
    prior=_base_.prior,
    data_preprocessor=dict(batch_augments=[_base_.edge_sampler]),
    bbox_head=dict(
        type='CaliDINOHead',
        califormer=califormer,
        rho=_base_.rho,
        loss_loma=_base_.loss_loma))

# matches the named prior to the dataset's classes before training
custom_hooks = _base_.custom_hooks + _base_.calidet_custom_hooks
