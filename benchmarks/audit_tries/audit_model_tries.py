# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tries of ``benchmarks/audit_hostile_inputs.py`` that need a model:
``set_prior`` and ``inference_detector`` (priors and images), checkpoints
through ``init_detector``, and the ONNX export and runtime. The tiny
coco-mini models have random weights: a result is judged only against
another route that must give the same (see ``audit_families``)."""
import json
import os
import os.path as osp

import numpy as np
import torch
from audit_families import (DINO, FCOS, IMAGES, INF, NAN, prior_moving_model,
                            same, same_dets, with_nan)

from testing import get_config, random_prior

K = 80


def _files(tmp):
    """Hostile image files and prior files, under ``tmp``."""
    os.makedirs(tmp, exist_ok=True)
    paths = {}

    def write(name, data):
        paths[name] = osp.join(tmp, name)
        with open(paths[name], 'wb') as f:
            f.write(data)

    with open(IMAGES[0], 'rb') as f:
        jpg = f.read()
    write('empty.jpg', b'')
    write('truncated.jpg', jpg[:len(jpg) // 3])
    write('text.jpg', b'not an image')
    write('header_only.jpg', jpg[:20])
    write('png_named.jpg', b'\x89PNG\r\n\x1a\n' + b'\x00' * 30)
    return paths


def inference_family(audit, tmp):
    """Images and priors given to ``inference_detector`` and ``set_prior``."""
    from mmdet.datasets import CocoDataset
    fam = 'inference'
    files = _files(tmp)
    model = prior_moving_model(DINO)
    classes = list(CocoDataset.METAINFO['classes'])
    e_a, e_b = random_prior(3), random_prior(4)
    img = IMAGES[0]
    import mmcv
    array = mmcv.imread(img)
    _inference_images(audit, fam, model, tmp, files, img, array)
    base = _inference_valid_images(audit, fam, model, img, array)
    _inference_call_priors(audit, fam, model, tmp, img, base, e_a, e_b,
                           classes)
    _inference_bad_priors(audit, fam, model, tmp, img, e_a, classes)
    _inference_bad_prior_lists(audit, fam, model, tmp, e_a, e_b)
    model.set_prior(model.current_prior())


def _inference_images(audit, fam, model, tmp, files, img, array):
    """Images that ``inference_detector`` must refuse."""
    from mmcalidet.apis import inference_detector

    # images
    bad_images = [
        ('[]', [], 'no images'),
        ('()', (), 'no images'),
        ('an empty file', files['empty.jpg'], 'empty'),
        ('a truncated jpg', files['truncated.jpg'], r'unreadable|truncated'),
        ('a text file named .jpg', files['text.jpg'], r'not an image'),
        ('a jpg header only', files['header_only.jpg'],
         r'unreadable|truncated|not an image'),
        ('a broken png named .jpg', files['png_named.jpg'],
         r'unreadable|not an image'),
        ('a missing file', osp.join(tmp, 'missing.jpg'), 'not found'),
        ('a folder', tmp, 'not a file'),
        ('0 x 0 array', np.zeros((0, 0, 3), np.uint8), 'empty'),
        ('0 x 5 array', np.zeros((0, 5, 3), np.uint8), 'empty'),
        ('2-D array', np.zeros((5, 5), np.uint8), r'H x W x 3'),
        ('H x W x 1', np.zeros((5, 5, 1), np.uint8), r'H x W x 3'),
        ('H x W x 4', np.zeros((5, 5, 4), np.uint8), r'H x W x 3'),
        ('4-D array', np.zeros((1, 5, 5, 3), np.uint8), r'H x W x 3'),
        ('all-NaN float32', np.full((32, 32, 3), NAN,
                                    np.float32), 'non-finite'),
        ('one NaN pixel', with_nan(array.astype(np.float32),
                                   (3, 3, 1)), 'non-finite'),
        ('inf pixel', with_nan(array.astype(np.float32), (0, 0, 0),
                               INF), 'non-finite'),
        ('string array', np.full((5, 5, 3), 'a'), 'numbers'),
        ('object array', np.full((5, 5, 3), None, object), 'numbers'),
        ('complex array', np.zeros((5, 5, 3), complex), 'numbers|complex'),
        ('[path, array]', [img, array], 'mix files and arrays'),
        ('[array, path]', [array, img], 'mix files and arrays'),
        ('an int', 3, r'image file|array'),
        ('None', None, r'image|None'),
        ('[None]', [None], r'image|None'),
        ('a dict', dict(img=img), r'image|dict'),
        ('bytes of a jpg', open(img, 'rb').read(), r'image|bytes'),
    ]
    for name, imgs, match in bad_images:
        audit.api(
            fam,
            f'inference_detector({name})',
            lambda i=imgs: inference_detector(model, i),
            match=match)


def _inference_valid_images(audit, fam, model, img, array):
    """Valid images by routes that must agree; returns the plain result."""
    import mmcv

    from mmcalidet.apis import inference_detector

    # images that are valid: routes that must agree
    base = inference_detector(model, img)
    # at the pipeline's own scale (256) the resize is the identity: a
    # uint8 resize rounds its result, a float one does not
    square = mmcv.imresize(array, (256, 256))
    at_scale = inference_detector(model, square)
    for dtype in (np.float32, np.float64, np.int16):
        audit.api(
            fam,
            f'inference: a {np.dtype(dtype).name} array vs uint8',
            lambda d=dtype: inference_detector(model, square.astype(d)),
            'accept',
            check=lambda r: same_dets(r, at_scale))
    checks = [
        ('a path vs its decoded array',
         lambda: inference_detector(model, array)),
        ('a non-contiguous array', lambda: inference_detector(
            model,
            np.ascontiguousarray(array[:, ::-1])[:, ::-1])),
        ('a pathlib path',
         lambda: inference_detector(model,
                                    __import__('pathlib').Path(img))),
        ('a tuple of one path', lambda: inference_detector(model, (img, ))[0]),
    ]
    for name, fn in checks:
        audit.api(
            fam,
            f'inference: {name}',
            fn,
            'accept',
            check=lambda r: same_dets(r, base))
    audit.api(
        fam,
        'inference: a batch of two vs one by one',
        lambda: inference_detector(model, IMAGES[:2]),
        'accept',
        check=lambda r: same_dets(
            r, [base, inference_detector(model, IMAGES[1])]))
    audit.api(
        fam,
        'inference: a 1 x 1 image',
        lambda: inference_detector(model, np.zeros((1, 1, 3), np.uint8)),
        'accept',
        check=lambda r: bool(
            np.isfinite(r.pred_instances.scores.numpy()).all()) or
        'wrong: non-finite scores')
    return base


def _inference_call_priors(audit, fam, model, tmp, img, base, e_a, e_b,
                           classes):
    """Priors given to the call, by routes that must agree."""
    from mmcalidet.apis import inference_detector
    from mmcalidet.priors import Prior, flat_prior, save_prior

    # priors given to the call
    named = osp.join(tmp, 'site.json')
    save_prior(named, e_a, classes)
    perm = list(np.random.default_rng(0).permutation(K))
    shuffled = osp.join(tmp, 'shuffled.json')
    save_prior(shuffled, e_a[np.ix_(perm, perm)], [classes[i] for i in perm])
    under_a = inference_detector(model, img, prior=e_a)
    audit.api(
        fam, 'inference: another prior moves the scores (the checks compare '
        'something)',
        lambda: inference_detector(model, img, prior=e_b),
        'accept',
        check=lambda r: not same(scores_or(r), scores_or(under_a), 1e-4) or
        'wrong: the prior changes nothing')

    def under_set_prior(prior):
        before = model.current_prior()
        model.set_prior(prior)
        try:
            return inference_detector(model, img)
        finally:
            model.set_prior(before)

    routes = [
        ('call prior vs set_prior',
         lambda: inference_detector(model, img, prior=e_a),
         lambda: under_set_prior(e_a)),
        ('a file vs its matrix',
         lambda: inference_detector(model, img, prior=named), lambda: under_a),
        ('a file in another class order vs in order',
         lambda: inference_detector(model, img, prior=shuffled),
         lambda: under_a),
        ('a Prior vs its file',
         lambda: inference_detector(model, img, prior=Prior.load(named)),
         lambda: under_a),
        ('a tensor vs an array', lambda: inference_detector(
            model, img, prior=torch.from_numpy(e_a).float()), lambda: under_a),
        ('a dict vs its matrix', lambda: inference_detector(
            model, img, prior=dict(matrix=e_a.tolist(), classes=classes)),
         lambda: under_a),
        ('per-image priors vs one call each',
         lambda: inference_detector(model, IMAGES[:2], prior=[e_a, e_b]),
         lambda: [under_a,
                  inference_detector(model, IMAGES[1], prior=e_b)]),
        ('a (2, K, K) stack vs a list', lambda: inference_detector(
            model, IMAGES[:2], prior=np.stack([e_a, e_b])),
         lambda: inference_detector(model, IMAGES[:2], prior=[e_a, e_b])),
        ('[None, E] uses the model prior for None',
         lambda: inference_detector(model, IMAGES[:2], prior=[None, e_b])[0],
         lambda: base),
        ('set_prior(None) is E0 = flat', lambda: under_set_prior(None),
         lambda: inference_detector(model, img, prior=flat_prior(K))),
        ('the prior of a call does not stay', lambda:
         (inference_detector(model, img, prior=e_b),
          inference_detector(model, img))[1], lambda: base),
    ]
    for name, got, want in routes:
        audit.api(
            fam,
            f'inference: {name}',
            got,
            'accept',
            check=lambda r, w=want: same_dets(r, w()))


def _inference_bad_priors(audit, fam, model, tmp, img, e_a, classes):
    """Bad priors to the call and to ``set_prior``, one image."""
    from mmcalidet.apis import inference_detector
    from mmcalidet.priors import save_prior

    # bad priors (to the call and to set_prior); set_prior keeps the old one
    unknown = osp.join(tmp, 'unknown_names.json')
    save_prior(unknown, e_a[:3, :3], ['cat', 'dog', 'zebra_crossing'])
    other_names = osp.join(tmp, 'other_names.json')
    save_prior(other_names, e_a, classes[:-1] + ['unicorn'])
    corrupt = osp.join(tmp, 'corrupt.json')
    with open(corrupt, 'w') as f:
        f.write('{"matrix": [[1')
    np.save(osp.join(tmp, 'k3.npy'), random_prior(0, 3))
    bad_priors = [
        ('NaN', with_nan(e_a), 'non-finite'),
        ('inf', with_nan(e_a, (2, 3), INF), 'non-finite'),
        ('-0.1', with_nan(e_a, (2, 3), -0.1), r'\[0, 1\]'),
        ('1.5', with_nan(e_a, (2, 3), 1.5), r'\[0, 1\]'),
        ('diagonal 0', with_nan(e_a, (4, 4), 0.0), 'diagonal'),
        ('K=3', random_prior(0, 3), r'K=3|80'),
        ('K=81', random_prior(0, 81), r'81|80'),
        ('1-D', np.full(K, 0.5), r'square|shape|K x K'),
        ('a missing file', osp.join(tmp, 'missing.json'), 'not found'),
        ('an unknown shipped name', 'coco2099_val', 'coco2099'),
        ('a corrupt file', corrupt, r'json|read|parse'),
        ('a K=3 .npy', osp.join(tmp, 'k3.npy'), r'K=3|80'),
        ('a file of unknown class names', unknown, r'zebra|class|K=3'),
        ('a file with one unknown name', other_names, 'unicorn|toothbrush'),
        ('NaN tensor', torch.full((K, K), NAN), 'non-finite'),
        ('a string matrix', np.full((K, K), 'x'), r'number'),
    ]
    for name, prior, match in bad_priors:
        audit.api(
            fam,
            f'inference_detector(prior {name})',
            lambda p=prior: inference_detector(model, img, prior=p),
            match=match)

        def set_and_keep(p=prior):
            before = model.get_prior().copy()
            try:
                model.set_prior(p)
            finally:
                if not same(model.get_prior(), before, 0):
                    raise AssertionError('a refused prior changed the model')

        audit.api(fam, f'set_prior({name})', set_and_keep, match=match)


def _inference_bad_prior_lists(audit, fam, model, tmp, e_a, e_b):
    """Bad priors for a batch of images, and bad ``set_prior`` options."""
    from mmcalidet.apis import inference_detector

    # bad priors for two images, and bad options of set_prior
    for name, prior, match in (
        ('3 priors for 2 images', [e_a] * 3, r'3|2'),
        ('a (3, K, K) stack for 2 images', np.stack([e_a] * 3), r'3|2'),
        ('a list with a NaN prior', [e_a, with_nan(e_b)], r'non-finite|1'),
        ('a list with a missing file', [e_a,
                                        osp.join(tmp,
                                                 'nope.json')], 'not found'),
    ):
        audit.api(
            fam,
            f'inference_detector(2 images, {name})',
            lambda p=prior: inference_detector(model, IMAGES[:2], prior=p),
            match=match)
    for name, kwargs, match in (
        ('marginals without support', dict(marginals=np.full(K, .5)),
         'support'),
        ('support of NaN',
         dict(support=np.full(K, NAN), marginals=np.full(K, .5)), 'finite'),
        ('marginals 2', dict(support=np.ones(K),
                             marginals=np.full(K, 2.)), r'\[0, 1\]'),
        ('support of K=3', dict(support=np.ones(3),
                                marginals=np.ones(3) / 2), r'\(80,\)|K|shape'),
    ):
        audit.api(
            fam,
            f'set_prior(E, {name})',
            lambda k=kwargs: model.set_prior(e_a, **k),
            match=match)


def scores_or(result):
    return result.pred_instances.scores.numpy()


# --- checkpoints ----------------------------------------------------------


def checkpoint_family(audit, tmp):
    """Hostile checkpoints and options given to ``init_detector``."""
    from mmcalidet.apis import init_detector
    fam = 'checkpoints'
    os.makedirs(tmp, exist_ok=True)
    cfg = get_config(DINO)
    torch.manual_seed(0)
    model = init_detector(cfg, None, device='cpu')
    state = {k: v.clone() for k, v in model.state_dict().items()}
    meta = dict(dataset_meta=dict(model.dataset_meta))
    saved_prior = torch.from_numpy(random_prior(9)).float()

    def save(name, state_dict, raw=None):
        path = osp.join(tmp, name)
        if raw is not None:
            with open(path, 'wb') as f:
                f.write(raw)
        else:
            torch.save(dict(state_dict=state_dict, meta=meta), path)
        return path

    good = save('good.pth', dict(state, prior=saved_prior))
    with open(good, 'rb') as f:
        data = f.read()
    nan_prior = saved_prior.clone()
    nan_prior[0, 1] = NAN
    missing = dict(state)
    missing.pop(next(k for k in state if 'bbox_head' in k))
    cases = [
        ('a missing file', osp.join(tmp, 'missing.pth'), r'not found|no '
         r'such|missing'),
        ('an empty file', save('empty.pth', None, b''), r'empty|read|load'),
        ('garbage bytes', save('junk.pth', None,
                               b'\x00junk' * 10), r'read|load|checkpoint'),
        ('a truncated checkpoint',
         save('trunc.pth', None,
              data[:len(data) // 2]), r'read|load|truncated|checkpoint'),
        ('a NaN prior', save('nan.pth', dict(state,
                                             prior=nan_prior)), 'non-finite'),
        ('a prior of K=3',
         save('k3.pth',
              dict(state, prior=torch.from_numpy(random_prior(0, 3)).float())),
         r'3|shape'),
        ('a prior of 1.5',
         save('over.pth', dict(state, prior=torch.full(
             (K, K), 1.5))), r'\[0, 1\]|diagonal'),
        ('a missing tensor', save('missing_key.pth',
                                  missing), r'missing|bbox_head'),
        ('a text file', save('text.pth', None,
                             b'hello world'), r'read|load|checkpoint'),
        ('a folder', tmp, r'folder|directory|not a (regular )?file'),
    ]
    for name, path, match in cases:
        audit.api(
            fam,
            f'init_detector(checkpoint {name})',
            lambda p=path: init_detector(cfg, p, device='cpu'),
            match=match)
    _checkpoint_good(audit, fam, cfg, good, state, saved_prior)


def _checkpoint_good(audit, fam, cfg, good, state, saved_prior):
    """Bad options with a good checkpoint, and what it must give back."""
    from mmcalidet.apis import init_detector

    # a good checkpoint: bad options, then what comes back
    for name, kwargs, match in (
        ("device 'cuda:0' on a CPU torch", dict(device='cuda:0'), r'cuda|cpu'),
        ("device 'gpu0'", dict(device='gpu0'), r'gpu0|device'),
        ('prior of K=3', dict(prior=random_prior(0, 3)), r'K=3|80'),
        ('a NaN prior', dict(prior=with_nan(random_prior(1))), 'non-finite'),
    ):
        if torch.cuda.is_available() and 'cuda' in kwargs.get('device', ''):
            continue
        audit.api(
            fam,
            f'init_detector(good, {name})',
            lambda k=kwargs: init_detector(cfg, good,
                                           **dict(dict(device='cpu'), **k)),
            match=match)
    audit.api(
        fam,
        'init_detector(good): the saved prior comes back',
        lambda: init_detector(cfg, good, device='cpu'),
        'accept',
        check=lambda m: same(m.get_prior(), saved_prior.numpy(), 1e-6) or
        'wrong prior')
    audit.api(
        fam,
        'init_detector(good, prior=E) replaces it',
        lambda: init_detector(cfg, good, device='cpu', prior=random_prior(2)),
        'accept',
        check=lambda m: same(m.get_prior(), random_prior(2), 1e-6) or
        'wrong prior')
    audit.api(
        fam,
        'init_detector(good): the weights come back',
        lambda: init_detector(cfg, good, device='cpu'),
        'accept',
        check=lambda m: all(
            torch.equal(v, state[k]) for k, v in m.state_dict().items()
            if k in state and k != 'prior') or 'wrong weights')


# --- the ONNX export and runtime ------------------------------------------


def onnx_family(audit, tmp):
    """The ONNX export, ``OnnxDetector`` and ``verify_onnx``."""
    from mmcalidet.deploy import OnnxDetector, export_onnx
    fam = 'onnx'
    os.makedirs(tmp, exist_ok=True)
    model = prior_moving_model(FCOS)
    out = osp.join(tmp, 'fcos.onnx')
    shape = (64, 64)
    _onnx_export_refusals(audit, fam, model, tmp, shape)
    export_onnx(model, out, shape, prior_input=True)
    detector = OnnxDetector(out)
    img = IMAGES[0]
    e_a = random_prior(3)
    _onnx_detector_refusals(audit, fam, detector, out, tmp, img, e_a)
    _onnx_routes(audit, fam, model, detector, tmp, img, e_a, shape)
    _onnx_verify(audit, fam, model, out, e_a)
    return out


def _onnx_export_refusals(audit, fam, model, tmp, shape):
    """Bad shapes, opsets and paths that ``export_onnx`` must refuse."""
    from mmcalidet.deploy import export_onnx

    # bad exports
    for name, args, match in (
        ('shape 33 x 47 (pad divisor 32)', ((33, 47), ), r'pad_size_divisor'),
        ('shape 100 x 100', ((100, 100), ), 'pad_size_divisor'),
        ('shape 0 x 0', ((0, 0), ), r'shape|0'),
        ('shape -64 x 64', ((-64, 64), ), r'shape|-64'),
        ('shape (64,)', ((64, ), ), r'shape|2'),
        ('shape 64.5 x 64', ((64.5, 64), ), r'shape|integer'),
        ('opset 7', (shape, True, 7), 'opset'),
    ):
        audit.api(
            fam,
            f'export_onnx({name})',
            lambda a=args: export_onnx(model, osp.join(tmp, 'bad.onnx'), *a),
            match=match,
            folder=tmp)
    audit.api(
        fam,
        'export_onnx(to /proc/x.onnx)',
        lambda: export_onnx(model, '/proc/mmcalidet-x.onnx', shape),
        match=r'/proc|cannot|write',
        folder=tmp)


def _onnx_detector_refusals(audit, fam, detector, out, tmp, img, e_a):
    """Files, images and priors that ``OnnxDetector`` must refuse."""
    from mmcalidet.deploy import OnnxDetector

    # bad models, images and priors
    for name, fn, match in (
        ('a missing file', lambda: OnnxDetector(osp.join(tmp, 'no.onnx')),
         'not found'),
        ('a text file', lambda: OnnxDetector(_text(tmp, 'x.onnx', 'hi')),
         'not an ONNX model'),
        ('an empty file', lambda: OnnxDetector(_text(tmp, 'e.onnx', '')),
         r'not an ONNX|empty'),
        ('threads -1', lambda: OnnxDetector(out, threads=-1), 'threads'),
        ('image NaN', lambda: detector(np.full(
            (64, 64, 3), NAN, np.float32)), 'non-finite'),
        ('image 0 x 0', lambda: detector(np.zeros(
            (0, 0, 3), np.uint8)), 'empty'),
        ('image 2-D', lambda: detector(np.zeros(
            (9, 9), np.uint8)), r'H x W x 3'),
        ('a truncated jpg', lambda: detector(_files(tmp)['truncated.jpg']),
         r'unreadable|truncated'),
        ('a missing image', lambda: detector(osp.join(tmp, 'none.jpg')),
         'not found|no such file'),
        ('prior K=3', lambda: detector(img, prior=random_prior(0, 3)),
         r'3|80'),
        ('prior NaN', lambda: detector(img, prior=with_nan(e_a)),
         'non-finite'),
        ('prior 1.5', lambda: detector(img, prior=np.full(
            (K, K), 1.5)), r'\[0, 1\]'),
        ('a list of priors', lambda: detector(img, prior=[e_a, e_a]),
         'one prior per call'),
        ('a missing prior file',
         lambda: detector(img, prior=osp.join(tmp, 'none.json')), 'not found'),
        ('score_thr 1.5', lambda: detector(img, score_thr=1.5), 'score_thr'),
        ('score_thr NaN', lambda: detector(img, score_thr=NAN), 'score_thr'),
        ('run_input of 32 x 32',
         lambda: detector.run_input(np.zeros(
             (1, 3, 32, 32), np.float32), e_a), r'64|shape'),
        ('run_input NaN', lambda: detector.run_input(
            np.full((1, 3, 64, 64), NAN, np.float32), e_a), 'non-finite'),
        ('run_input 3-D',
         lambda: detector.run_input(np.zeros(
             (3, 64, 64), np.float32), e_a), r'shape|1, 3'),
    ):
        audit.api(fam, f'OnnxDetector: {name}', fn, match=match)


def _onnx_routes(audit, fam, model, detector, tmp, img, e_a, shape):
    """ONNX against PyTorch and other routes that must agree."""
    import copy

    from mmcalidet.apis import inference_detector
    from mmcalidet.priors import Prior, save_prior

    # routes that must agree
    named = osp.join(tmp, 'site.json')
    from mmdet.datasets import CocoDataset
    save_prior(named, e_a, list(CocoDataset.METAINFO['classes']))
    reference = copy.deepcopy(model)
    pipeline = reference.cfg.test_dataloader.dataset.pipeline
    resize = [i for i, s in enumerate(pipeline) if s['type'] == 'Resize'][0]
    pipeline[resize] = dict(
        type='Resize', scale=(shape[1], shape[0]), keep_ratio=False)

    def onnx_vs_torch(prior):
        got = detector(IMAGES[:2], prior=prior)
        want = inference_detector(reference, IMAGES[:2], prior=prior)
        paired = 0
        for result, sample in zip(got, want):
            pred = sample.pred_instances
            if len(result['scores']) != len(pred.scores):
                return f'wrong: {len(result["scores"])} vs ' \
                    f'{len(pred.scores)} detections'
            if not same(
                    np.sort(result['scores']), np.sort(pred.scores.numpy()),
                    1e-4):
                return 'wrong: scores differ'
            paired += len(pred.scores)
        return f'{paired} detections agree' if paired else \
            'wrong: nothing to compare'

    audit.api(
        fam,
        'ONNX vs PyTorch under E',
        lambda: e_a,
        'accept',
        check=onnx_vs_torch)
    audit.api(
        fam,
        'ONNX vs PyTorch under the stored prior',
        lambda: None,
        'accept',
        check=onnx_vs_torch)
    audit.api(
        fam,
        'OnnxDetector: a file vs its Prior',
        lambda:
        (detector(img, prior=named), detector(img, prior=Prior.load(named))),
        'accept',
        check=lambda r: same(r[0]['scores'], r[1]['scores']) or 'wrong')
    audit.api(
        fam,
        'OnnxDetector: a path vs its array',
        lambda: (detector(img, prior=e_a),
                 detector(__import__('mmcv').imread(img), prior=e_a)),
        'accept',
        check=lambda r: same(r[0]['scores'], r[1]['scores']) or 'wrong')


def _onnx_verify(audit, fam, model, out, e_a):
    """``verify_onnx`` must pair detections and refuse what it cannot."""
    from mmcalidet.deploy import verify_onnx

    # verify_onnx
    audit.api(
        fam,
        'verify_onnx pairs detections',
        lambda: verify_onnx(out, model, IMAGES[:1], (None, e_a)),
        'accept',
        check=lambda r: r['ok'] and r['paired'] > 0 and f'{r["paired"]} paired'
        or f'wrong: {r.get("failures")}')
    audit.api(
        fam,
        'verify_onnx with min_paired beyond reach fails',
        lambda: verify_onnx(out, model, IMAGES[:1], min_paired=10**6),
        'accept',
        check=lambda r: not r['ok'] and 'paired' in r['failures'][0] or
        'wrong: passed with too few pairs')
    audit.api(
        fam,
        'verify_onnx(a K=3 prior)',
        lambda: verify_onnx(out, model, IMAGES[:1], (random_prior(0, 3), )),
        match=r'3|80')


def _text(tmp, name, text):
    path = osp.join(tmp, name)
    with open(path, 'w') as f:
        f.write(text)
    return path


def write_json(path, data):
    with open(path, 'w') as f:
        json.dump(data, f)
    return path
