# Site batches (the last relation-reading candidate of the project README,
# "Relation-reading candidates"): the support-aware prior
# (calidet_dino_tiny_context-shift_cached_support.py) with its 'sim_site'
# mode replaced by batches drawn from a simulated site, each with that
# site's statistics as its prior (the mode 'site').
#
# Why: the 'sim_site' mode gives a tilted site's E_b(n) to a batch of other
# images, which it misleads (prior_signal.py: -68 millinats per fractional
# entry against E_t), so it teaches the calibrator to discount dense priors.
# Here half the batches come from a site (a tilt of the class mixture, or a
# tilt of which class pairs go together with each class's frequency held,
# 15 % of the 2,000 images), and the 'site' mode gives them E_b(n) of n of
# the site's images (n log-uniform in 1-256) with its support: the same
# kind of prior now predicts the images it calibrates (+51 / +23).
#
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   python tools/train.py \
#       projects/context_shift/experiments/site_simulation/calidet_dino_tiny_context-shift_cached_site_batches.py \
#       --work-dir work_dirs/context_shift/calidet_cached_site_batches
_base_ = ['../../configs/calidet_dino_tiny_context-shift_cached_support.py']
# the recipe's dataset, batch sampler and edge sampler
custom_imports = dict(
    _base_.custom_imports,
    imports=_base_.custom_imports.imports +
    ['projects.context_shift.experiments.site_simulation.recipe'])

# the share of batches drawn from a site; the 'site' mode's weight replaces
# the support-aware recipe's 'sim_site'
site_prob = 0.5
site_mode_weight = 1.0

_sampler = _base_.model.data_preprocessor.batch_augments[0]
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _sampler,
            type='SiteEdgeSampler',
            mode_probs=dict(
                _sampler.mode_probs, sim_site=0.0, site=site_mode_weight))
    ]))

train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='SiteSimulatedDataset',
        dataset=_base_.train_dataloader.dataset,
        kinds=('tilt', 'pairs'),
        tilt_std=1.0,
        tilt_fraction=0.15,
        pair_strength=16.0,
        site_support=_sampler.site_support),
    batch_sampler=dict(type='SiteBatchSampler', site_prob=site_prob))
