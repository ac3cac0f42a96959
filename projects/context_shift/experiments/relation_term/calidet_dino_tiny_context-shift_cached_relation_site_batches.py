# The learned relation term trained on site batches: the relation term of
# calidet_dino_tiny_context-shift_cached_relation.py with the site-batches
# recipe (../site_simulation/calidet_dino_tiny_context-shift_cached_site_batches.py):
# half the batches come from a simulated site (a class tilt, or a pair tilt
# with each class's frequency held) and carry E_b(n) of n of that site's
# images, so a prior's relations predict the images they calibrate.
#
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   python tools/train.py \
#       projects/context_shift/experiments/relation_term/calidet_dino_tiny_context-shift_cached_relation_site_batches.py \
#       --work-dir work_dirs/context_shift/calidet_cached_relation_site_batches
_base_ = [
    '../site_simulation/calidet_dino_tiny_context-shift_cached_site_batches.py'
]
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
