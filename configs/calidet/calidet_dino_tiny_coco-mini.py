# CaliDet on the tiny DINO of dino_tiny_coco-mini.py (same model, data and
# budget): CaliDINO + CaliDINOHead (CaliFormer, rho, LoMa) + EdgeSampler.
_base_ = './dino_tiny_coco-mini.py'
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

# E_t and the default deployment prior: a prior file or a shipped name
prior = 'coco2017_train'

model = dict(
    type='CaliDINO',
    prior=prior,
    data_preprocessor=dict(batch_augments=[
        dict(
            type='EdgeSampler',
            num_classes=80,
            prior=prior,
            mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0),
            noise_std=0.16)
    ]),
    bbox_head=dict(
        type='CaliDINOHead',
        # scaled like the tiny transformer (1/3 of DINO's depth, 1/4 of its
        # FFN width): the paper's CaliFormer has 3 layers and a 2048 FFN
        califormer=dict(
            type='CaliFormer',
            num_layers=1,
            num_heads=8,
            feedforward_channels=512),
        rho=0.2,
        loss_loma=dict(type='LoMaLoss', loss_weight=20.0)))
