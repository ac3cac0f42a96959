# CaliDINO twin of dino_tiny_context-shift.py (same model, data, budget),
# with the CaliDet parts of calidet/calidet_dino_tiny_coco-mini.py and the
# benchmark's own train statistics as E_t and default prior.
_base_ = './dino_tiny_context-shift.py'
custom_imports = dict(
    imports=['mmcalidet', 'mmcalidet.engine.checkpoint_hooks'],
    allow_failed_imports=False)

prior = '{{$MMCALIDET_CS_DATA:data/context_shift}}/priors/E_t.json'

model = dict(
    type='CaliDINO',
    prior=prior,
    data_preprocessor=dict(batch_augments=[
        dict(
            type='EdgeSampler',
            num_classes=10,
            prior=prior,
            mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0),
            noise_std=0.16)
    ]),
    bbox_head=dict(
        type='CaliDINOHead',
        califormer=dict(
            type='CaliFormer',
            num_layers=1,
            num_heads=8,
            feedforward_channels=512),
        rho=0.2,
        loss_loma=dict(type='LoMaLoss', loss_weight=20.0)))
