# Copyright (c) mmcalidet contributors. All rights reserved.
"""The library validates what its tools validate: a NaN, an infinity or an
out-of-range number given to the Python API is refused in one line naming
the argument, and nothing non-finite reaches a prior, a table or a result
through a cache or the ONNX runtime (the numbered cases of the second
careless-user audit)."""
import argparse
import json
import math
import os.path as osp
import runpy

import numpy as np
import pytest
import torch
from mmengine.structures import InstanceData

from mmcalidet.calibration import (OnlineSelfCalibrator, calibration_step,
                                   fit_site_prior, prediction_statistics,
                                   self_calibrate)
from mmcalidet.decoder_cache import CacheError, DecoderCache
from mmcalidet.evaluation import CocoEvaluator
from mmcalidet.evaluation.baselines import CooccurrenceRescoring
from mmcalidet.priors import flat_prior
from mmcalidet.utils.validation import (check_finite_array, check_float,
                                        check_int)
from testing import PROJECT_ROOT, run_tool_in_process

K = 4
NAN = float('nan')
#: the evaluation tools' shared options (tools/, out of the library)
add_model_args = runpy.run_path(
    osp.join(PROJECT_ROOT, 'tools', 'analysis_tools',
             'eval_options.py'))['add_model_args']


def one_line(exc_info) -> str:
    """The error's message, asserted to be one line."""
    message = str(exc_info.value)
    assert '\n' not in message, message
    return message


def test_check_float_and_int_name_the_argument():
    assert check_float('eta', 4) == 4.0
    assert check_float('r', None, 0, allow_none=True) is None
    for bad in (NAN, math.inf, -math.inf, '1', True, None, 0.0, -1):
        with pytest.raises(ValueError, match=r'^eta must be a finite number '
                           r'> 0, got '):
            check_float('eta', bad, 0, low_open=True)
    assert check_int('iters', 0, 0) == 0 and check_int('n', 3.0, 1) == 3
    for bad in (NAN, 2.5, -1, '3', True):
        with pytest.raises(ValueError, match=r'^iters must be an integer'):
            check_int('iters', bad, 0)
    check_finite_array(np.ones(3), 'x')
    with pytest.raises(ValueError, match=r'the prior holds a non-finite '
                       r'value \(nan at index \(1,\)\)'):
        check_finite_array(np.array([0.5, NAN]), 'the prior')
    with pytest.raises(ValueError, match='hidden'):
        check_finite_array(torch.tensor([[0.0, math.inf]]), 'hidden')


# 1. --cooc-beta nan made every co-occurrence score NaN, tables written
def test_cooc_beta_nan_is_refused_by_the_parser_and_the_api(capsys):
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    assert parser.parse_args(['--cooc-beta', '0.5']).cooc_beta == 0.5
    for value in ('nan', 'inf'):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(['--cooc-beta', value])
        assert exc.value.code == 2
        assert 'argument --cooc-beta: a finite number' in \
            capsys.readouterr().err
    for option in ('--max-images', '--rescore-batch-size', '--batch-size'):
        with pytest.raises(SystemExit):
            parser.parse_args([option, '0'])
    with pytest.raises(ValueError, match='^beta must be a finite number'):
        CooccurrenceRescoring(flat_prior(K), beta=NAN)
    from mmcalidet.evaluation import EvalSetup

    # refused before any config or checkpoint is read
    with pytest.raises(ValueError, match='^cooc_beta must be a finite'):
        EvalSetup('no_such_config.py', 'none', cooc_beta=NAN)


# 2. eta = nan or inf gave the flat prior E0 exactly (NaN filled with 0.5)
@pytest.mark.parametrize('eta', [NAN, math.inf, 0.0, -1.0])
def test_a_non_finite_step_size_is_refused(eta):
    with pytest.raises(ValueError, match='^eta must be a finite number > 0'):
        self_calibrate(None, [], eta=eta)  # checked before the model is
    with pytest.raises(ValueError, match='^eta must be a finite number > 0'):
        OnlineSelfCalibrator(init_prior=flat_prior(K), eta=eta)
    from mmcalidet.engine.self_calibration_hook import \
        OnlineSelfCalibrationHook
    with pytest.raises(ValueError, match='^eta must be a finite number > 0'):
        OnlineSelfCalibrationHook(eta=eta)
    prior = flat_prior(K)
    with pytest.raises(ValueError, match=r'^eta \(the step size\) must be'):
        calibration_step(prior, prior, np.full(K, 0.5), eta)


def test_a_calibration_step_names_the_non_finite_input():
    prior, stats, z = flat_prior(K), flat_prior(K), np.full(K, 0.5)
    bad = prior.copy()
    bad[0, 1] = NAN
    with pytest.raises(ValueError, match='^the prior E_c holds a non-'):
        calibration_step(bad, stats, z, 4.0)
    with pytest.raises(ValueError, match='^the prediction statistics E_i'):
        calibration_step(prior, bad, z, 4.0)
    with pytest.raises(ValueError, match='^the mean detection scores Z'):
        calibration_step(prior, stats, np.full(K, NAN), 4.0)


def test_the_online_hook_restores_the_prior_when_saving_fails(
        tmp_path, monkeypatch):
    """The hook failed after the epoch and left the calibrated prior in
    the model."""
    from mmcalidet.engine.self_calibration_hook import \
        OnlineSelfCalibrationHook

    class Model:
        prior = 'E_t'

        def get_prior(self):
            return flat_prior(K)

        def set_prior(self, prior):
            self.prior = prior

    class Logger:

        def info(self, *args):
            pass

        warning = info

    class Runner:
        model = Model()
        logger = Logger()
        work_dir = str(tmp_path)

    runner = Runner()
    hook = OnlineSelfCalibrationHook(save_prior='prior.json')
    hook._saved = 'E_t'
    hook.calibrator = OnlineSelfCalibrator(init_prior=flat_prior(K))
    hook._classes = lambda runner, model: [str(k) for k in range(K)]
    runner.model.prior = 'E_c'

    def full_disk(*args, **kwargs):
        raise OSError('no space left on device')

    import mmcalidet.priors
    monkeypatch.setattr(mmcalidet.priors.Prior, 'save', full_disk)
    with pytest.raises(OSError, match='no space'):
        hook._end(runner)
    assert runner.model.prior == 'E_t'


# 3. score_thr = nan (or 2.0) was accepted and did nothing
@pytest.mark.parametrize('score_thr', [NAN, 2.0, -0.1])
def test_a_score_threshold_outside_0_1_is_refused(score_thr):
    with pytest.raises(ValueError, match=r'^score_thr must be a finite '
                       r'number in \[0, 1\]'):
        self_calibrate(None, [], score_thr=score_thr)
    with pytest.raises(ValueError, match='^score_thr must be'):
        OnlineSelfCalibrator(init_prior=flat_prior(K), score_thr=score_thr)
    with pytest.raises(ValueError, match='^score_thr must be'):
        prediction_statistics([], K, score_thr)


def coco_site(tmp_path, images, categories):
    """A COCO file: ``images`` is a list of annotation category ids per
    image (each annotation one 20 x 20 box)."""
    imgs, anns = [], []
    for i, cats in enumerate(images, start=1):
        imgs.append(dict(id=i, width=100, height=100, file_name=f'{i}.jpg'))
        for k, cat in enumerate(cats):
            anns.append(
                dict(
                    id=len(anns) + 1,
                    image_id=i,
                    category_id=cat,
                    bbox=[10.0 + 25 * k, 10.0, 20.0, 20.0],
                    area=400.0,
                    iscrowd=0))
    path = tmp_path / 'site.json'
    path.write_text(
        json.dumps(
            dict(
                images=imgs,
                annotations=anns,
                categories=[
                    dict(id=c, name=name) for c, name in categories
                ])))
    return str(path)


class SiteRescorer:
    """Each ground-truth box of the model's classes detected with its class
    at a score that depends on the prior (no detector)."""

    def __init__(self, evaluator, img_ids):
        known = {c: k for k, c in enumerate(evaluator.cat_ids)}
        self.rows = []
        for img_id in img_ids:
            anns = [
                a for a in evaluator.coco.imgToAnns.get(img_id, [])
                if a['category_id'] in known
            ]
            boxes = np.array([[
                a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                a['bbox'][1] + a['bbox'][3]
            ] for a in anns]).reshape(-1, 4)
            labels = np.array([known[a['category_id']] for a in anns],
                              dtype=np.int64)
            self.rows.append((img_id, boxes, labels))
        rows = self.rows

        class Cache:

            def __len__(self):
                return len(rows)

            def gt_label_lists(self):
                return [labels for _, _, labels in rows]

            def img_ids(self):
                return [img_id for img_id, _, _ in rows]

        self.cache = Cache()

    def predict(self, prior, indices=None):
        prior = np.asarray(prior)
        indices = range(len(self.rows)) if indices is None else indices
        out = []
        for i in indices:
            _, boxes, labels = self.rows[i]
            scores = [0.3 + 0.5 * prior[c, (c + 1) % K] for c in labels]
            out.append(
                InstanceData(
                    bboxes=boxes.astype(np.float32),
                    scores=np.asarray(scores, dtype=np.float32),
                    labels=labels))
        return out


# 4. annotations of classes the model does not have were dropped silently
def test_fit_site_prior_counts_and_reports_what_it_drops(tmp_path):
    from testing import captured_log
    cats = [(k + 1, f'c{k}') for k in range(K)] + [(99, 'stranger')]
    images = [[1, 2, 99], [3, 99], [1, 4], [2, 3, 99], [], [1]] * 2
    path = coco_site(tmp_path, images, cats)
    evaluator = CocoEvaluator(path, [f'c{k}' for k in range(K)])
    rescorer = SiteRescorer(evaluator, list(range(1, len(images) + 1)))
    with captured_log() as log:
        fit = fit_site_prior(
            rescorer, evaluator, flat_prior(K), resamples=20, folds=2)
    assert fit.dropped == dict(unknown_class=6, images_without_labels=2)
    assert fit.meta()['dropped'] == fit.dropped
    assert any('6 of 22 site annotations are of classes the model does '
               'not have' in line for line in log), log


# 5. a site without annotations gave NaN gains, recorded as 0.0 [0, 0]
def test_a_site_without_usable_annotations_is_refused(tmp_path):
    cats = [(k + 1, f'c{k}') for k in range(K)] + [(99, 'stranger')]
    for images, found in (([[]] * 6, 0), ([[99], [99, 99], []] * 2, 6)):
        path = coco_site(tmp_path, images, cats)
        evaluator = CocoEvaluator(path, [f'c{k}' for k in range(K)])
        rescorer = SiteRescorer(evaluator, list(range(1, len(images) + 1)))
        with pytest.raises(ValueError) as exc:
            fit_site_prior(
                rescorer, evaluator, flat_prior(K), resamples=20, folds=2)
        assert f'the 6 site images hold no annotation of the model\'s ' \
            f'classes to fit a prior on ({found} annotations found, ' \
            f'{found} of classes the model does not have)' == \
            one_line(exc)
    with pytest.raises(ValueError, match='^folds must be an integer >= 2'):
        fit_site_prior(rescorer, evaluator, flat_prior(K), folds=NAN)


def nan_cache(tmp_path, layers='all'):
    """A cache folder of the right size whose hidden states of image 1 are
    NaN (as a damaged disk or a broken writer would leave it)."""
    from mmdet.structures import DetDataSample

    from mmcalidet.decoder_cache import DecoderCacheWriter
    writer = DecoderCacheWriter(
        str(tmp_path / 'cache'), fingerprint=dict(a=1), layers=layers)
    g = torch.Generator().manual_seed(0)
    samples = []
    for k in range(3):
        ds = DetDataSample(
            metainfo=dict(
                img_id=k, img_path=f'{k}.jpg', img_shape=(8, 8),
                ori_shape=(8, 8), scale_factor=(1.0, 1.0)))
        ds.gt_instances = InstanceData(
            bboxes=torch.zeros(1, 4), labels=torch.zeros(1, dtype=torch.long))
        samples.append(ds)
    writer.add(
        torch.randn(2, 3, 5, 8, generator=g), torch.rand(2, 3, 5, 4,
                                                         generator=g),
        samples, 0)
    folder = writer.commit().folder
    hidden = np.load(osp.join(folder, 'hidden.npy'), mmap_mode='r+')
    hidden[1] = np.nan
    hidden.flush()
    del hidden
    return folder


# 6. a cache whose hidden states are NaN was "reused" and "valid"
def test_a_cache_of_non_finite_hidden_states_is_refused_naming_the_file(
        tmp_path):
    folder = nan_cache(tmp_path)
    cache = DecoderCache.open(folder)  # the header checks still pass
    hidden, _, _ = cache.get([0, 2])  # the good images are read
    assert torch.isfinite(hidden).all()
    hidden_file = osp.join(folder, 'hidden.npy')
    for read in (lambda: cache.get([2, 1]), lambda: cache.layers_of(1),
                 lambda: DecoderCache.open(folder).check_values()):
        with pytest.raises(CacheError) as exc:
            read()
        assert isinstance(exc.value, ValueError)
        assert one_line(exc).startswith(
            f'decoder cache file {hidden_file}: the hidden values of image '
            '1 are not finite')
    # a data-loader worker re-raises it from its message alone
    assert str(CacheError(str(exc.value))) == str(exc.value)


@pytest.mark.slow
def test_the_cache_check_tool_names_the_non_finite_file(tmp_path):
    folder = nan_cache(tmp_path)
    hidden_file = osp.join(folder, 'hidden.npy')
    proc = run_tool_in_process(
        'tools/analysis_tools/cache_decoder_outputs.py', '--check', folder)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'valid' not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f'cache_decoder_outputs.py: error: decoder cache file {hidden_file}')


class FakeSession:
    """Records what ONNX Runtime was fed."""

    def __init__(self):
        self.feeds = []

    def run(self, names, feeds):
        self.feeds.append(feeds)
        return np.zeros((0, 5), np.float32), np.zeros((0, ), np.int64)


def fake_detector(prior_input=True, folded=False, model='CaliDINO'):
    """An OnnxDetector over a fake session (its checks run before the
    session; no export needed)."""
    from mmcalidet.deploy import OnnxDetector
    detector = OnnxDetector.__new__(OnnxDetector)
    detector.session = FakeSession()
    detector.onnx_file = 'm.onnx'
    detector.meta = dict(
        input_shape=[8, 8], prior_input=prior_input, folded=folded,
        model=model)
    detector.classes = None
    detector.num_classes = K
    detector.prior_input = prior_input
    detector.default_prior = flat_prior(K).astype(np.float32)
    return detector


# 8. run_input with a NaN prior returned NaN scores; 3. score_thr nan
#    returned no detections
def test_run_input_checks_the_prior_as_the_call_does():
    detector = fake_detector()
    tensor = np.zeros((1, 3, 8, 8), np.float32)
    bad = flat_prior(K)
    bad[0, 1] = NAN
    with pytest.raises(ValueError, match='non-finite') as exc:
        detector.run_input(tensor, bad)
    one_line(exc)
    with pytest.raises(ValueError, match='the input tensor holds'):
        detector.run_input(np.full((1, 3, 8, 8), NAN, np.float32))
    with pytest.raises(ValueError, match='shape'):
        detector.run_input(np.zeros((1, 3, 9, 8), np.float32))
    assert detector.session.feeds == []
    detector.run_input(tensor, flat_prior(K))
    assert detector.session.feeds[0]['prior'].dtype == np.float32
    with pytest.raises(ValueError, match=r'^score_thr must be a finite '
                       r'number in \[0, 1\]'):
        detector(np.zeros((8, 8, 3), np.uint8), score_thr=NAN)
    assert len(detector.session.feeds) == 1


# 10. a plain DINO's export given a prior was told it is "folded"
def test_a_plain_export_is_told_it_takes_no_prior():
    with pytest.raises(ValueError, match='DINO, which takes no prior'):
        fake_detector(prior_input=False, model='DINO').resolve_prior(
            'coco2017_val')
    with pytest.raises(ValueError, match='folded into its weights'):
        fake_detector(prior_input=False, folded=True).resolve_prior(
            'coco2017_val')


# 9. onnx_demo.py on a file that is not ONNX: a traceback
def test_a_file_that_is_not_onnx_is_refused_in_one_line(tmp_path):
    from mmcalidet.deploy import OnnxDetector
    bogus = tmp_path / 'model.onnx'
    bogus.write_text('not an onnx file')
    with pytest.raises(ValueError, match='is not an ONNX model') as exc:
        OnnxDetector(str(bogus))
    one_line(exc)


@pytest.mark.slow
def test_the_onnx_demo_refuses_a_file_that_is_not_onnx_in_one_line(
        tmp_path):
    bogus = tmp_path / 'model.onnx'
    bogus.write_text('not an onnx file')
    image = osp.join(tmp_path, 'x.png')
    import mmcv
    mmcv.imwrite(np.zeros((8, 8, 3), np.uint8), image)
    proc = run_tool_in_process('tools/deployment/onnx_demo.py', image,
                               str(bogus), '--out-dir', str(tmp_path / 'out'))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'is not an ONNX model' in lines[0], \
        proc.stderr


def truncated_jpeg(path) -> str:
    """The first half of a coco-mini JPEG: its header reads, it does not
    decode."""
    from testing import data_root
    source = osp.join(data_root(), 'coco-mini', 'images', 'val2017',
                      '000000000139.jpg')
    with open(source, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    return source


# 9. image_demo.py on a folder with a truncated JPEG: an AssertionError and
#    nothing written, not even the good images
def test_a_truncated_image_is_skipped_and_named(tmp_path, capsys):
    import shutil

    from mmcalidet.utils.image_files import check_images
    folder = tmp_path / 'images'
    folder.mkdir()
    good = truncated_jpeg(folder / 'cut.jpg')
    shutil.copy(good, folder / 'good.jpg')
    files = [str(folder / 'cut.jpg'), str(folder / 'good.jpg')]
    assert check_images(files, 10**8) == ([files[1]], 1)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f'skipped {files[0]}: unreadable image' in \
        err[0] and 'truncated' in err[0], err


@pytest.mark.slow
def test_image_demo_writes_the_good_images_of_a_folder(tmp_path, run_tool):
    import shutil

    from mmdet.datasets import CocoDataset
    from mmengine.runner import save_checkpoint

    from testing import PROJECT_ROOT, build_detector
    config = 'calidet/calidet_dino_tiny_coco-mini.py'
    model = build_detector(config)
    checkpoint = str(tmp_path / 'tiny.pth')
    save_checkpoint(
        dict(
            state_dict=model.state_dict(),
            meta=dict(
                dataset_meta=dict(
                    classes=list(CocoDataset.METAINFO['classes'])))),
        checkpoint)
    folder = tmp_path / 'images'
    folder.mkdir()
    shutil.copy(truncated_jpeg(folder / 'cut.jpg'), folder / 'good.jpg')
    out = tmp_path / 'out'
    proc = run_tool('tools/demo/image_demo.py', str(folder),
                    osp.join(PROJECT_ROOT, 'configs', config), checkpoint,
                    '--out-dir', str(out), '--cfg-options',
                    'test_dataloader.dataset.pipeline.1.scale=(96,96)')
    assert proc.returncode == 1, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert f'skipped {folder / "cut.jpg"}' in proc.stderr
    assert (out / 'vis' / 'good.jpg').is_file()
    assert not (out / 'vis' / 'cut.jpg').exists()


# 9. training a cached config with source=None on a torn cache: a
#    38-line traceback, and a work_dir made
@pytest.mark.slow
def test_training_on_a_torn_cache_is_one_line_and_no_work_dir(
        tmp_path):
    from testing import PROJECT_ROOT, damage_cache_file
    folder = nan_cache(tmp_path)
    hidden = damage_cache_file(folder, 'hidden.npy', 'truncate')
    proc = run_tool_in_process(
        'tools/train.py',
        osp.join(PROJECT_ROOT, 'configs', 'calidet',
                 'calidet_dino_tiny_coco-mini_cached.py'), '--cfg-options',
        'train_dataloader.dataset.source=None',
        f'train_dataloader.dataset.cache_dir={folder}',
        cwd=str(tmp_path))
    assert proc.returncode == 1
    assert 'Traceback' not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f'train.py: error: decoder cache file {hidden}: truncated'), last
    assert not (tmp_path / 'work_dirs').exists()


# 10. tools/test.py --prior bad.json made work_dirs/<config>/<time>/ first
@pytest.mark.slow
def test_test_py_refuses_a_bad_prior_before_making_a_work_dir(
        tmp_path):
    from testing import PROJECT_ROOT
    bad = tmp_path / 'bad.json'
    bad.write_text('{"matrix": [[1.0, ')
    checkpoint = tmp_path / 'x.pth'
    checkpoint.write_bytes(b'not read before the prior is checked')
    proc = run_tool_in_process(
        'tools/test.py',
        osp.join(PROJECT_ROOT, 'configs', 'calidet',
                 'calidet_dino_tiny_coco-mini.py'), str(checkpoint),
        '--prior', str(bad),
        cwd=str(tmp_path))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('test.py: error: --prior: ') and str(bad) in last
    assert not (tmp_path / 'work_dirs').exists()


#: the packages whose public functions and classes are walked
PUBLIC = ('mmcalidet.apis', 'mmcalidet.evaluation', 'mmcalidet.calibration',
          'mmcalidet.priors', 'mmcalidet.deploy', 'mmcalidet.engine')


def _takes_a_float(param) -> bool:
    """A parameter annotated ``float`` / ``Optional[float]`` or with a float
    default."""
    import typing
    ann = param.annotation
    if ann is float or float in typing.get_args(ann):
        return True
    return isinstance(param.default, float)


def public_float_arguments():
    """``(label, callable, its signature, parameter)`` for every float
    parameter of the public API: functions, classes (``__init__``) and
    their public methods; result records (dataclasses) are not inputs."""
    import dataclasses
    import importlib
    import inspect
    found = []
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                if dataclasses.is_dataclass(obj):
                    continue
                members = [(name, obj, inspect.signature(obj.__init__))]
                members += [(f'{name}.{attr}', fn, inspect.signature(fn))
                            for attr, fn in vars(obj).items()
                            if (not attr.startswith('_') or attr == '__call__')
                            and inspect.isfunction(fn)]
            elif inspect.isfunction(obj):
                members = [(name, obj, inspect.signature(obj))]
            else:
                continue
            for label, fn, sig in members:
                for param in sig.parameters.values():
                    if _takes_a_float(param):
                        found.append((f'{module_name}.{label}', fn, sig,
                                      param.name))
    return found


FLOAT_ARGUMENTS = public_float_arguments()


def test_the_walk_finds_the_public_float_arguments():
    labels = {(label.split('.')[-1], name)
              for label, _, _, name in FLOAT_ARGUMENTS}
    for expected in [('self_calibrate', 'eta'),
                     ('self_calibrate', 'trust_radius'),
                     ('OnlineSelfCalibrator', 'score_thr'),
                     ('OnlineSelfCalibrationHook', 'momentum'),
                     ('EvalSetup', 'cooc_beta'), ('__call__', 'score_thr'),
                     ('fit_site_prior', 'alphas'), ('shrink', 'alpha'),
                     ('validate_prior', 'atol'),
                     ('SelfCalibrationTestLoop', 'eta')]:
        assert expected in labels, expected
    assert len(FLOAT_ARGUMENTS) >= 25


@pytest.mark.parametrize(
    'label,fn,sig,name',
    FLOAT_ARGUMENTS,
    ids=[f'{label}:{name}' for label, _, _, name in FLOAT_ARGUMENTS])
def test_every_public_float_argument_refuses_nan(label, fn, sig, name):
    """Each is checked at the entry, before the other arguments are used
    (they are given as ``None`` here), in one line naming it."""
    import collections.abc
    import inspect
    import typing
    args = {
        p.name: None
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    ann = sig.parameters[name].annotation
    # a sequence of floats gets one NaN among good values
    args[name] = [0.5, NAN] if typing.get_origin(ann) in (
        list, tuple, collections.abc.Sequence) else NAN
    if inspect.isclass(fn):
        args.pop('self', None)
    with pytest.raises(ValueError) as exc:
        fn(**args)
    assert one_line(exc).startswith(name), (label, str(exc.value))


# 4. the prior readers of annotation files count what they leave out too
def test_reading_a_subset_of_classes_counts_the_annotations_left_out(
        tmp_path):
    from mmcalidet.priors.label_io import read_coco_labels
    cats = [(k + 1, f'c{k}') for k in range(K)] + [(99, 'stranger')]
    path = coco_site(tmp_path, [[1, 99], [99, 99], [2]], cats)
    sets = read_coco_labels(path, [f'c{k}' for k in range(K)])
    assert sets.extra['outside_classes'] == 3
    assert [list(x) for x in sets.label_lists()] == [[0], [], [1]]
    assert read_coco_labels(path).extra['outside_classes'] == 0
