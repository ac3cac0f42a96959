# The learned relation term (a candidate of the project README, "A site's
# relations through the image"): the support-aware prior
# (calidet_dino_tiny_context-shift_cached_support.py) whose head also moves
# each class's logit by the site's relations weighted by the classes this
# image shows, with pair weights learned from the CaliFormer's output nodes
# (relation_term.py). Same edge sampler (E_x, E_b, E_t + noise, sim_site).
#
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   python tools/train.py \
#       projects/context_shift/experiments/relation_term/calidet_dino_tiny_context-shift_cached_relation.py \
#       --work-dir work_dirs/context_shift/calidet_cached_relation
_base_ = ['../../configs/calidet_dino_tiny_context-shift_cached_support.py']
custom_imports = dict(
    _base_.custom_imports,
    imports=_base_.custom_imports.imports +
    ['projects.context_shift.experiments.relation_term.relation_term'])

model = dict(
    bbox_head=dict(
        type='RelationCaliDINOHead',
        relation_rho=1.0,
        evidence_drop=0.1,
        califormer=dict(type='RelationCaliFormer', relation_rank=32)))
