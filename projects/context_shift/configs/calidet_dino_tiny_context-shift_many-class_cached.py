# The many-class CaliDINO calibrated on cached decoder outputs of the
# many-class DINO: calidet_dino_tiny_context-shift_many-class.py with the
# calibrator training of ../_base_/calibrator.py, as
# calidet_dino_tiny_context-shift_cached.py has it for 10 classes.
_base_ = [
    './calidet_dino_tiny_context-shift_many-class.py',
    '../../../configs/_base_/calibrator.py'
]

dino_config = ('projects/context_shift/configs/'
               'dino_tiny_context-shift_many-class.py')
# the baseline, named once: tools/train.py makes the cache from it
load_from = 'work_dirs/context_shift_many-class/dino/iter_3000.pth'

model = dict(
    type=_base_.calibrator_model_type,
    detector=_base_.model.type,
    data_preprocessor=_base_.calibrator_preprocessor)

train_dataloader = dict(
    _base_.calibrator_dataloader,
    dataset=dict(
        type='DecoderCacheDataset',
        cache_dir='work_dirs/context_shift_many-class/dino/'
        'decoder_cache_train',
        source=dict(config=dino_config, passes=1)))

max_iters = _base_.calibrator_max_iters
train_cfg = _base_.calibrator_train_cfg
param_scheduler = _base_.calibrator_param_scheduler
default_hooks = _base_.calibrator_default_hooks
model_wrapper_cfg = _base_.calibrator_model_wrapper_cfg
optim_wrapper = _base_.calibrator_optim_wrapper
