# The CaliDet delta of calidet.py for Deformable DETR (the paper's
# supplementary, "Porting to D-DETR"): the same parts (CaliDeformableDETR,
# CaliDeformableDETRHead) with an EdgeSampler that adds E_b(4), E_b over
# groups of 4 images of the (global) batch. Named variables only, as
# calidet.py.
_base_ = './calidet.py'

edge_sampler_group4 = dict(
    _base_.edge_sampler,
    mode_probs=dict(sample=1.0, batch=1.0, dataset=1.0, group=1.0),
    group_size=4)
