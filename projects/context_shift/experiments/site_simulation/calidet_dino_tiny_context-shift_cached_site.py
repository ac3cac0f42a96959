# Site-simulated training of the cached calibrator (a rejected recipe of
# this project, experiments/site_simulation/recipe.py): half the batches
# come from a simulated deployment site (the training images with or
# without one class, or a random tilt of the class mixture), all of a
# batch's images from it;
# the sampler adds a fourth mode to the paper's E_x / E_b / E_t, the
# statistics of the population the batch was drawn from (the site's E_site,
# E_t for a batch of the whole set). Everything else is the default recipe
# (calidet_dino_tiny_context-shift_cached.py).
#
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   python tools/train.py \
#       projects/context_shift/experiments/site_simulation/calidet_dino_tiny_context-shift_cached_site.py \
#       --work-dir work_dirs/context_shift/calidet_cached_site
_base_ = ['../../configs/calidet_dino_tiny_context-shift_cached.py']
# the CPU's deformable attention by mmcalidet's compiled kernel
# (mmcalidet/models/layers/cpu_deform_attn.py)
custom_imports = dict(
    imports=[
        'mmcalidet',
        'mmcalidet.engine.checkpoint_hooks',
        'projects.context_shift.experiments.site_simulation.recipe',
        'mmcalidet.models.layers.enable_cpu_deform_attn'
    ],
    allow_failed_imports=False)

# the share of batches drawn from a simulated site, and the weight of the
# 'site' mode beside the paper's three
site_prob = 0.5
site_mode_weight = 1.0

model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _base_.edge_sampler,
            type='SiteEdgeSampler',
            mode_probs=dict(
                _base_.edge_sampler.mode_probs, site=site_mode_weight))
    ]))

train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='SiteSimulatedDataset',
        dataset=_base_.train_dataloader.dataset,
        # a 'with' / 'without' site holds at least 32 of the 2,000 images;
        # a tilt re-samples a quarter of them
        min_images=32,
        tilt_std=1.0,
        tilt_fraction=0.25),
    batch_sampler=dict(type='SiteBatchSampler', site_prob=site_prob))
