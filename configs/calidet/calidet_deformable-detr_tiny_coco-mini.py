# CaliDet on the tiny single-scale Deformable DETR of
# deformable-detr_tiny_coco-mini.py (same model, data and budget):
# CaliDeformableDETR + CaliDeformableDETRHead (CaliFormer, rho, LoMa) +
# EdgeSampler with the supplementary's extra E_b(4) edges.
_base_ = './deformable-detr_tiny_coco-mini.py'
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# E_t and the default deployment prior: a prior file or a shipped name
prior = 'coco2017_train'

model = dict(
    type='CaliDeformableDETR',
    prior=prior,
    data_preprocessor=dict(batch_augments=[
        dict(
            type='EdgeSampler',
            num_classes=80,
            prior=prior,
            mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0, group=1.0),
            group_size=4,
            noise_std=0.16)
    ]),
    bbox_head=dict(
        type='CaliDeformableDETRHead',
        # scaled like the tiny transformer (see calidet_dino_tiny_coco-mini)
        califormer=dict(
            type='CaliFormer',
            num_layers=1,
            num_heads=8,
            feedforward_channels=512),
        rho=0.2,
        loss_loma=dict(type='LoMaLoss', loss_weight=20.0)))
