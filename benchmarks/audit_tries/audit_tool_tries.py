# Copyright (c) mmcalidet contributors. All rights reserved.
"""The tries of ``benchmarks/audit_hostile_inputs.py`` that run the tools as
a user runs them: each in a process of its own (forked from one that has
imported torch and mmdet: :func:`testing.run_tool`), one thread, in a
working folder that a refusal must leave as it was. A tool's accepted run
is judged against the library's route that must give the same."""
import json
import os
import os.path as osp
import shutil

import numpy as np
import torch
from audit_families import DINO, FCOS, IMAGES, NAN, same

from testing import PROJECT_ROOT, brute_force_prior, get_config, random_prior

TOOLS = 'tools/analysis_tools/'
UNWRITABLE = '/proc/mmcalidet-audit'
K = 80


def coco(images=(1, 2), boxes=([1, 2, 3, 4], [0, 0, 5, 5]), cats=(1, )):
    """A small COCO annotation dict (one image per box, the last shared)."""
    return dict(
        images=[
            dict(id=i, file_name=f'{k}.jpg', width=10, height=10)
            for k, i in enumerate(images)
        ],
        annotations=[
            dict(
                id=k + 1,
                image_id=images[min(k,
                                    len(images) - 1)],
                category_id=cats[k % len(cats)],
                bbox=box,
                area=10,
                iscrowd=0) for k, box in enumerate(boxes)
        ],
        categories=[dict(id=c, name=f'class{c}') for c in sorted(set(cats))])


def bad_annotations():
    """The malformed annotation files that must be refused, as
    ``(name, data, match)``."""
    return [
        ('duplicated image ids', coco(images=(1, 1)), 'duplicated image id'),
        ('a NaN bbox', coco(boxes=([1, 2, NAN, 4], )), 'non-finite'),
        ('a negative bbox', coco(boxes=([1, 2, -3, 4], )), 'negative'),
        ('a bbox of 3 numbers', coco(boxes=([1, 2, 3], )), '4 numbers'),
        ('no images', coco(images=(), boxes=()), 'no images'),
        ('an unknown image_id',
         dict(
             coco(),
             annotations=[
                 dict(id=1, image_id=99, category_id=1, bbox=[0, 0, 1, 1])
             ]), r'image_id|99'),
        ('an unknown category_id',
         dict(
             coco(),
             annotations=[
                 dict(id=1, image_id=1, category_id=42, bbox=[0, 0, 1, 1])
             ]), r'category|42'),
        ('no categories key', {
            'images': [],
            'annotations': []
        }, r'categories|COCO'),
    ]


class _Site:
    """The audit, its working folder and the configs the tries share."""

    def __init__(self, audit, tmp):
        from mmdet.datasets import CocoDataset
        self.audit = audit
        self.tmp = tmp
        self.work = osp.join(tmp, 'work')
        self.classes = list(CocoDataset.METAINFO['classes'])
        self.dino = osp.join(PROJECT_ROOT, 'configs', DINO)
        self.fcos = osp.join(PROJECT_ROOT, 'configs', FCOS)

    def put(self, name, data):
        """Write ``data`` (bytes, text or JSON) as ``name`` in the folder."""
        path = osp.join(self.work, name)
        if isinstance(data, bytes):
            with open(path, 'wb') as f:
                f.write(data)
        elif isinstance(data, str):
            with open(path, 'w') as f:
                f.write(data)
        else:
            with open(path, 'w') as f:
                json.dump(data, f)
        return name

    def run(self,
            name,
            script,
            *args,
            expect='refuse',
            match=None,
            check=None):
        """One try of ``script`` run with ``args`` in the folder."""
        return self.audit.tool('tools', name, script, list(args), self.work,
                               expect, match, check)


def _set_up(site):
    """Make the folder and the files the tries read."""
    from mmcalidet.priors import save_prior
    put, work, classes = site.put, site.work, site.classes
    os.makedirs(osp.join(work, 'images'))
    os.makedirs(osp.join(work, 'empty_dir'))
    shutil.copy(
        osp.join(PROJECT_ROOT, 'mmcalidet/data/priors/coco2017_train.json'),
        osp.join(work, 'base.json'))
    put('x.pth', b'weights')
    put('a_file', 'kept')
    put('corrupt.json', '{"matrix": [[1')
    put('empty.json', '')
    np.save(osp.join(work, 'k3.npy'), random_prior(0, 3))
    nan_prior = random_prior(1)
    nan_prior[0, 1] = NAN
    put('nan.json', dict(matrix=nan_prior.tolist(), classes=classes))
    save_prior(osp.join(work, 'site.json'), random_prior(3), classes)
    with open(IMAGES[0], 'rb') as f:
        jpg = f.read()
    put('truncated.jpg', jpg[:len(jpg) // 3])
    shutil.copy(IMAGES[0], osp.join(work, 'images', 'a.jpg'))


def _edit_prior_refusals(site):
    """edit_prior.py: the refusals."""
    run = site.run
    # --- edit_prior.py
    edit = 'tools/misc/edit_prior.py'
    for name, args, match in (
        ('an unknown class', ['--set', 'persn|bicycle=0.9'], 'persn'),
        ('a value of 1.5', ['--set', 'person|bicycle=1.5'], r'\[0, 1\]|1.5'),
        ('a value of nan', ['--set',
                            'person|bicycle=nan'], r'nan|non-finite|number'),
        ('no "|"', ['--set', 'person=0.5'], r'I\|J=V|\|'),
        ('no "="', ['--set', 'person|bicycle'], r'I\|J=V|='),
        ('the diagonal', ['--set',
                          'person|person=0.5'], r'diagonal|P\(i \| i\)'),
        ('no --set', [], 'nothing to do'),
    ):
        run(f'edit_prior.py {name}',
            edit,
            'base.json',
            *args,
            '--out',
            'edited.json',
            match=match)
    run('edit_prior.py a missing base',
        edit,
        'missing.json',
        '--set',
        'person|bicycle=0.9',
        '--out',
        'e.json',
        match='missing.json')
    run('edit_prior.py a corrupt base',
        edit,
        'corrupt.json',
        '--set',
        'person|bicycle=0.9',
        '--out',
        'e.json',
        match='corrupt.json')
    run('edit_prior.py --out /proc/x.json',
        edit,
        'base.json',
        '--set',
        'person|bicycle=0.9',
        '--out',
        f'{UNWRITABLE}/x.json',
        match='cannot')
    run('edit_prior.py --out a folder',
        edit,
        'base.json',
        '--set',
        'person|bicycle=0.9',
        '--out',
        'images',
        match='folder')


def _edit_prior_accepted(site):
    """edit_prior.py: two valid edits, checked."""
    from mmcalidet.priors import Prior
    run, work = site.run, site.work
    edit = 'tools/misc/edit_prior.py'
    base = Prior.load(osp.join(work, 'base.json'))
    p, b, c = (base.classes.index(n) for n in ('person', 'bicycle', 'cat'))

    def edited(_):
        out = Prior.load(osp.join(work, 'edited_ok.json'))
        want = np.array(base.matrix)
        want[p, b] = 0.95
        col = want[:, c].copy()
        want[:, c] = 0.2
        want[c, c] = col[c]
        if not same(out.matrix, want, 1e-6):
            return 'wrong: the edited matrix is not the edits'
        return 'the edits, and only them' if not out.has_support else \
            'wrong: the measured support was kept'

    run('edit_prior.py two valid edits',
        edit,
        'base.json',
        '--set',
        'person|bicycle=0.95',
        '--set',
        '*|cat=0.2',
        '--out',
        'edited_ok.json',
        expect='accept',
        check=edited)


def _compute_prior_refusals(site):
    """compute_prior.py: the refusals."""
    run, put = site.run, site.put
    # --- compute_prior.py
    compute = TOOLS + 'compute_prior.py'
    bad_anns = bad_annotations()
    for name, data, match in bad_anns:
        put('ann.json', data)
        run(f'compute_prior.py {name}',
            compute,
            'ann.json',
            '--out',
            'p.json',
            match=match)
    run('compute_prior.py an empty file',
        compute,
        'empty.json',
        '--out',
        'p.json',
        match=r'empty')
    run('compute_prior.py a corrupt file',
        compute,
        'corrupt.json',
        '--out',
        'p.json',
        match=r'json|corrupt')
    run('compute_prior.py a missing file',
        compute,
        'missing.json',
        '--out',
        'p.json',
        match=r'missing.json')
    put('ann.json', coco())
    run('compute_prior.py --out /proc/x.json',
        compute,
        'ann.json',
        '--out',
        f'{UNWRITABLE}/x.json',
        match='cannot')
    run('compute_prior.py --decimals -1',
        compute,
        'ann.json',
        '--out',
        'p.json',
        '--decimals',
        '-1',
        match='decimals')


def _compute_prior_accepted(site):
    """compute_prior.py: a valid file vs counting by hand."""
    from mmcalidet.priors import Prior
    run, put, work = site.run, site.put, site.work
    compute = TOOLS + 'compute_prior.py'
    labels = [[0, 1], [1], [2], [0, 2], [1, 2], []]
    put(
        'valid.json',
        dict(
            images=[
                dict(id=i + 1, file_name=f'{i}.jpg', width=9, height=9)
                for i in range(len(labels))
            ],
            annotations=[
                dict(
                    id=10 * i + j,
                    image_id=i + 1,
                    category_id=c + 1,
                    bbox=[0, 0, 2, 2],
                    area=4,
                    iscrowd=0) for i, ls in enumerate(labels)
                for j, c in enumerate(ls)
            ],
            categories=[
                dict(id=c + 1, name=n) for c, n in enumerate(['a', 'b', 'c'])
            ]))
    want = brute_force_prior([np.array(x) for x in labels], 3)
    run('compute_prior.py a valid file vs counting by hand',
        compute,
        'valid.json',
        '--out',
        'valid_prior.json',
        '--no-progress',
        expect='accept',
        check=lambda _: same(
            Prior.load(osp.join(work, 'valid_prior.json')).matrix, want, 1e-6)
        or 'wrong: not the counted prior')


def _fit_site_prior(site):
    """fit_site_prior.py: refusals before the checkpoint is read."""
    run, put, dino = site.run, site.put, site.dino
    bad_anns = bad_annotations()
    # --- fit_site_prior.py (refusals before the checkpoint is read)
    fit = TOOLS + 'fit_site_prior.py'

    def fit_site(name,
                 match,
                 ann='site_ann.json',
                 images='images',
                 out='fitted.json'):
        return run(
            name,
            fit,
            dino,
            'x.pth',
            '--site-ann',
            ann,
            '--site-img-dir',
            images,
            '--out',
            out,
            '--out-dir',
            'out',
            match=match)

    for name, data, match in bad_anns[:3] + [
        ('an empty list of images', coco(images=(), boxes=()), 'no images')
    ]:
        put('site_ann.json', data)
        fit_site(f'fit_site_prior.py {name}', match)
    fit_site('fit_site_prior.py an empty file', 'empty', ann='empty.json')
    put('site_ann.json', coco())
    fit_site(
        'fit_site_prior.py --out /proc/x.json',
        'cannot',
        out=f'{UNWRITABLE}/x.json')
    fit_site(
        'fit_site_prior.py a missing image folder',
        'no_images',
        images='no_images')
    run('fit_site_prior.py --seed -1',
        fit,
        dino,
        'x.pth',
        '--out',
        'fitted.json',
        '--seed',
        '-1',
        match='seed')


def _eval_priors(site):
    """eval_priors.py: the refusals."""
    run, dino = site.run, site.dino
    # --- eval_priors.py
    evalp = TOOLS + 'eval_priors.py'
    for name, args, match in (
        ('an unknown prior name', ['--priors', 'E_t', 'E_zzz'], 'E_zzz'),
        ('a missing prior file', ['--priors', 'E_t',
                                  'site=/missing.json'], 'missing.json'),
        ('a NaN prior file', ['--priors', 'E_t',
                              'bad=nan.json'], 'non-finite'),
        ('a prior given twice', ['--priors', 'E_t', 'E_t'], 'twice'),
        ('--out-dir a file', ['--out-dir', 'a_file'], 'is a file'),
    ):
        extra = [] if '--out-dir' in args else ['--out-dir', 'out']
        run(f'eval_priors.py {name}',
            evalp,
            dino,
            'x.pth',
            *extra,
            *args,
            match=match)
    run('eval_priors.py a missing checkpoint',
        evalp,
        dino,
        'missing.pth',
        '--out-dir',
        'work_dirs/out',
        match='missing.pth')


def _cache_and_test(site):
    """cache_decoder_outputs.py and tools/test.py: the refusals."""
    run, dino = site.run, site.dino
    # --- cache_decoder_outputs.py and tools/test.py
    cache = TOOLS + 'cache_decoder_outputs.py'
    run('cache_decoder_outputs.py --out an existing file',
        cache,
        dino,
        'x.pth',
        '--out',
        'a_file',
        match='is a file')
    run('cache_decoder_outputs.py --seed 2**32',
        cache,
        dino,
        'x.pth',
        '--out',
        'c2',
        '--seed',
        str(2**32),
        match='seed')
    run('cache_decoder_outputs.py --num-images 0',
        cache,
        dino,
        'x.pth',
        '--out',
        'c3',
        '--num-images',
        '0',
        match='num-images|num_images')
    run('test.py --prior of K=3',
        'tools/test.py',
        dino,
        'x.pth',
        '--prior',
        'k3.npy',
        '--work-dir',
        'wd',
        match='K=3')
    run('test.py --prior NaN',
        'tools/test.py',
        dino,
        'x.pth',
        '--prior',
        'nan.json',
        '--work-dir',
        'wd',
        match='non-finite')


def _export_onnx(site):
    """export_onnx.py: the refusals."""
    run, fcos = site.run, site.fcos
    # --- export_onnx.py (no checkpoint: 'none')
    export = 'tools/deployment/export_onnx.py'
    for name, args, match in (
        ('--shape 100 100 (pad divisor 32)', ['--shape', '100',
                                              '100'], 'pad_size_divisor'),
        ('--shape 0 0', ['--shape', '0', '0'], 'shape'),
        ('--shape -64 64', ['--shape', '-64', '64'], 'shape'),
        ('--fold-prior a missing file', ['--fold-prior',
                                         'missing.json'], 'missing.json'),
        ('--fold-prior K=3', ['--fold-prior', 'k3.npy'], 'K=3'),
        ('--verify-prior NaN', ['--verify', '--verify-prior',
                                'nan.json'], 'non-finite'),
        ('--min-paired -1', ['--verify', '--min-paired', '-1'], 'min-paired'),
    ):
        run(f'export_onnx.py {name}',
            export,
            fcos,
            'none',
            '--out',
            'det.onnx',
            *args,
            match=match)
    run('export_onnx.py --out /proc/x.onnx',
        export,
        fcos,
        'none',
        '--out',
        f'{UNWRITABLE}/x.onnx',
        match='cannot|no such file')


def _onnx_demo(site):
    """onnx_demo.py on a graph exported here."""
    from mmcalidet.deploy import export_onnx
    run, work, tmp = site.run, site.work, site.tmp
    # --- onnx_demo.py on a graph exported here
    from audit_families import prior_moving_model
    graph = osp.join(tmp, 'graph.onnx')
    export_onnx(prior_moving_model(FCOS), graph, (64, 64), prior_input=True)
    demo = 'tools/deployment/onnx_demo.py'
    image = osp.join(work, 'images', 'a.jpg')
    for name, args, match in (
        ('--prior K=3', [image, graph, '--prior', 'k3.npy'], 'K=3'),
        ('--prior NaN', [image, graph, '--prior', 'nan.json'], 'non-finite'),
        ('--prior missing', [image, graph, '--prior',
                             'missing.json'], 'missing.json'),
        ('--compare-prior corrupt',
         [image, graph, '--compare-prior', 'corrupt.json'], 'corrupt.json'),
        ('a truncated jpg', ['truncated.jpg',
                             graph], r'truncated|could be run'),
        ('an empty image folder', ['empty_dir', graph], r'no image|empty'),
        ('a missing graph', [image, 'no.onnx'], 'no.onnx'),
        ('a text file as graph', [image, 'a_file'], r'a_file|ONNX'),
        ('--out-dir a file', [image, graph, '--out-dir',
                              'a_file'], 'is a file'),
        ('--score-thr 1.5', [image, graph, '--score-thr',
                             '1.5'], 'score-thr|score_thr'),
        ('--threads -1', [image, graph, '--threads', '-1'], 'threads'),
    ):
        extra = [] if '--out-dir' in args else ['--out-dir', 'demo_out']
        run(f'onnx_demo.py {name}', demo, *args, *extra, match=match)

    def onnx_preds(_):
        from mmcalidet.deploy import OnnxDetector
        with open(osp.join(work, 'demo_ok', 'preds', 'a.json')) as f:
            got = json.load(f)
        # the demo writes every detection (--score-thr is what it draws)
        want = OnnxDetector(graph)(image, prior=osp.join(work, 'site.json'))
        if not len(want['scores']):
            return 'wrong: nothing to compare'
        return same(got['scores'], want['scores'], 1e-5) and \
            f'{len(want["scores"])} detections as the API' or \
            'wrong: the demo differs from OnnxDetector'

    run('onnx_demo.py --prior site.json vs OnnxDetector',
        demo,
        image,
        graph,
        '--prior',
        'site.json',
        '--score-thr',
        '0.3',
        '--out-dir',
        'demo_ok',
        expect='accept',
        check=onnx_preds)


def _image_demo(site):
    """image_demo.py on a saved checkpoint."""
    run, work, dino = site.run, site.work, site.dino
    image = osp.join(work, 'images', 'a.jpg')
    # --- image_demo.py on a saved checkpoint
    from mmcalidet.apis import inference_detector, init_detector
    cfg = get_config(DINO)
    torch.manual_seed(0)
    model = init_detector(cfg, None, device='cpu')
    ckpt = osp.join(work, 'dino.pth')
    torch.save(
        dict(
            state_dict=model.state_dict(),
            meta=dict(dataset_meta=dict(model.dataset_meta))), ckpt)
    image_demo = 'tools/demo/image_demo.py'
    for name, args, match in (
        ('--device cuda:0', ['--device', 'cuda:0'], r'cuda'),
        ('--prior K=3', ['--prior', 'k3.npy'], 'K=3'),
        ('--prior NaN', ['--prior', 'nan.json'], 'non-finite'),
        ('--out-dir a file', ['--out-dir', 'a_file'], 'is a file'),
        ('--score-thr nan', ['--score-thr', 'nan'], 'score-thr|score_thr'),
    ):
        if torch.cuda.is_available() and 'cuda' in name:
            continue
        extra = [] if '--out-dir' in args else ['--out-dir', 'demo_out']
        run(f'image_demo.py {name}',
            image_demo,
            image,
            dino,
            'dino.pth',
            *args,
            *extra,
            match=match)
    run('image_demo.py a truncated jpg',
        image_demo,
        'truncated.jpg',
        dino,
        'dino.pth',
        '--out-dir',
        'demo_out',
        match='truncated|could be run')
    run('image_demo.py a corrupt checkpoint',
        image_demo,
        image,
        dino,
        'x.pth',
        '--out-dir',
        'demo_out',
        match='x.pth')

    def demo_preds(_):
        with open(osp.join(work, 'image_ok', 'preds', 'a.json')) as f:
            got = json.load(f)
        loaded = init_detector(cfg, ckpt, device='cpu')
        pred = inference_detector(
            loaded, image, prior=osp.join(work, 'site.json')).pred_instances
        keep = pred.scores.numpy() >= 0.3
        want = pred.scores.numpy()[keep]
        if not len(want):
            return 'wrong: nothing to compare'
        return same(np.sort(got['scores']), np.sort(want), 1e-4) and \
            f'{len(want)} detections as inference_detector' or \
            'wrong: the demo differs from inference_detector'

    run('image_demo.py --prior site.json vs inference_detector',
        image_demo,
        image,
        dino,
        'dino.pth',
        '--prior',
        'site.json',
        '--score-thr',
        '0.3',
        '--out-dir',
        'image_ok',
        expect='accept',
        check=demo_preds)


def tools_family(audit, tmp):
    """The tools' tries, section by section, in one working folder."""
    site = _Site(audit, tmp)
    _set_up(site)
    for section in (_edit_prior_refusals, _edit_prior_accepted,
                    _compute_prior_refusals, _compute_prior_accepted,
                    _fit_site_prior, _eval_priors, _cache_and_test,
                    _export_onnx, _onnx_demo, _image_demo):
        section(site)
